"""dspark-sim: a simulated DGX Spark cluster (containers with sshd + their own docker engine).

Library API (used by the CLI ``python -m sim`` and by pytest fixtures)::

    from sim import cluster, faults
    info = cluster.create("sim", nodes=3)     # idempotent
    cluster.status("sim"); cluster.stop_node("sim", "spark2"); cluster.start_node("sim", "spark2")
    cluster.ssh_info("sim"); cluster.delete("sim")
    faults.fabric("sim"); faults.set_rail("sim", "spark2", "roceP2p1s0f1", state="DOWN")
    faults.reset_fabric("sim")

Errors: ``sim.inventory.SimError``.
"""
