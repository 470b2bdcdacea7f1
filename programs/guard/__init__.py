"""The guard: what keeps a serving group serving when nobody is there (stdlib only).

One guard container per node of every serving group, declared by the program, started by the node's
docker with a restart policy (so it is back after a reboot or a power cut), shipped as one zip archive
(`python3 guard.pyz`, built by planning/guard.py). The guard on the group's head node leads: it watches
every rank (its own through the node's docker socket, the others through their node's guard) and the
head's API; on a fault (a rank exited or OOM-killed, a node rebooted, the head hung) it restarts the
whole group in the program's order, after the program's start gates, with the containers Pulumi
created. The other guards only answer it: their rank's state, stop, start, and the node's start gates,
for requests signed with the group's token (`wire`). It never creates, removes or reconfigures a
container, and it exists only between a successful `up` and the next change of its group (Pulumi
replaces it first), so it cannot fight an `up`.

    wire     signed requests between a group's guards (HMAC-SHA256, per-node, per-instance, no replay)
    dockerapi the node's docker engine API over its unix socket (inspect, start, stop)
    decide   the pure state machine: observations -> what to do next (attempts, backoff, hang)
    journal  the leader's persisted state: attempts, the heal in progress, the last heals
    heal     the leader's heal: out of rotation, stop, gates, start, serving, back in rotation
    main     arguments, the loop, the HTTP endpoints (/metrics, /status, /v1/...)
"""
