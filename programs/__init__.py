"""Programs run outside the Pulumi program, standard library only: by local commands where Pulumi
runs (`probe`: the readiness probe; `membership`: a group's place in the router's rotation), or inside
the serving image on each node (`argcheck`: the engine's own parsers on a rank's argv), or inside the
team gateway's image (`gateway/`: LiteLLM's hooks and the key records, written to the node and mounted).

May import: the standard library only (an engine package inside the image, for `argcheck`; LiteLLM,
FastAPI, psycopg and prometheus_client inside the gateway image, for `gateway/`). They
are run as `python3 -m programs.<name>` or fed to `python3 -` on stdin, where nothing else of this
project exists.
"""
