"""A local cluster: `rmq up`, `status`, `kill`, `restart`, `down`.

* `commands.py`: the typer commands; `up_arguments.py` reads a plain `rmq up` command line
  without typer, so `cli/main.py` can start the cluster sooner;
* `topology.py`: flags and a TOML file resolved into one plan; `up.py`: the port plan, the
  node command lines and the readiness probe; `dledger_plan.py`: the same for
  `rmq up --dledger N` (Raft groups instead of masters and slaves);
* `supervisor.py`: one OS process per node, watched from one Trio nursery;
* `state.py`: the state file and control socket through which `status`, `kill`, `restart`
  and `down` reach a running supervisor;
* `render.py`: what these commands print;
* `prometheus.py`: `rmq up --metrics`, a Prometheus server as one more node of the plan, run
  under `tether.py` (which stops it with the supervisor); `alerts.yml`: its alert rules.

Each node runs `python -m cli.servers.node` (`cli/servers/`).
"""
