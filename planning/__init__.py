"""The pure plan: from a validated config to everything the program will create, computed once.
`plan` (rank specs: mounts, limits, the group revision), `launch` (each rank's command line, env and
entrypoint script), `memoryplan` (the checkpoints' memory profiles, the memory plan, a rank's need and
limit), `stackplan` (builds the plan of every group and the router: the dataclasses of `clusterplan`,
and of `nodeplan` for each node), `commands` (every shell command string, quoted), `routing` (the
router's spec and rotation commands), `monitoring` (scrape targets, dashboard), `clientconfig` (the
`client_config` output), `budget` (each node's memory budget: every container placed there with its
limit, the rank's need), and `rules` (the validation rules, here because the memory and argv rules
evaluate the plan: `rulebook` is their framework, `node_rules`, `link_rules`, `serving_rules`,
`memory_rules`, `router_rules`, `budget_rules` and `monitoring_rules` hold them by area, and `rules`
runs them all in order). No module imports one that imports it back (tests/unit/test_layout.py).

May import: the standard library, `declared`, and `programs` (to ship a program's source or read its
constants). Never `pulumi`: the plan is computed and tested without it, and `dspark plan` prints it.
"""
