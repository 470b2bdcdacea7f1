"""sim/providers/detailed_diff.py: the bridge's MakeDetailedDiffV2 paths and kinds, as the docker double reports them."""

from sim.providers.detailed_diff import detailed_diff

SHAPES = {"command": "list", "envs": "set", "labels": "set", "capabilities": "object", "driverOpts": "map"}


def test_a_reordered_set_is_no_change_and_a_set_element_is_reported_at_its_index():
    assert detailed_diff({"envs": ["A=1", "B=2"]}, {"envs": ["B=2", "A=1"]}, SHAPES, set()) == {}
    assert detailed_diff({"envs": ["A=1", "B=2"]}, {"envs": ["A=1", "B=3"]}, SHAPES, {"envs"}) == {
        "envs[1]": "UPDATE_REPLACE"}  # B=2 gone at old index 1, B=3 new at input index 1: one element updated
    assert detailed_diff({"envs": ["A=1"]}, {"envs": ["A=1", "C=3"]}, SHAPES, set()) == {"envs[1]": "ADD"}


def test_list_elements_follow_the_edit_script():
    assert detailed_diff({"command": ["a", "b", "c"]}, {"command": ["a", "c"]}, SHAPES, set()) == {"command[1]": "DELETE"}
    assert detailed_diff({"command": ["a"]}, {"command": ["x", "a"]}, SHAPES, set()) == {"command[0]": "ADD"}


def test_objects_and_maps_are_diffed_key_by_key_with_quoted_keys_where_needed():
    assert detailed_diff({"capabilities": {"adds": ["A"]}}, {"capabilities": {"adds": ["A", "B"]}}, SHAPES,
                         {"capabilities"}) == {"capabilities.adds[1]": "ADD_REPLACE"}  # fmt: skip
    assert detailed_diff({"driverOpts": {"a.b": "1"}}, {"driverOpts": {"a.b": "2", "o": "x"}}, SHAPES, set()) == {
        'driverOpts["a.b"]': "UPDATE", "driverOpts.o": "ADD"}
    assert detailed_diff({"memory": 1}, {}, SHAPES, set()) == {"memory": "DELETE"}
    assert detailed_diff({"memory": 1}, {"memory": 2}, SHAPES, {"*"}) == {"memory": "UPDATE_REPLACE"}
