"""The elastic driver: keeps a job running between --min-np and --max-np while hosts come and go.

`discovery` finds the hosts, `hosts` remembers them (order, blacklist, cooldown), `plan` turns
them into the next round's slots (pure), and `driver` starts and stops workers and publishes
each round through the rendezvous store. Workers meet rounds through the `store` bootstrap.
"""

from horovod.runner.elastic.driver import ElasticDriver, ElasticSpec

__all__ = ["ElasticDriver", "ElasticSpec"]
