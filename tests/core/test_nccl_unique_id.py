"""NCCL's unique id reaches every member of a group over our own authenticated connections,
made once by the group's first member: the one part of forming a communicator that needs no GPU."""

import pytest

from multirank import hvdrun

from horovod.common.settings import Settings
from horovod.common.transport.nccl import library

if library.find(Settings()).path is None:
    pytest.skip("no libnccl here (pip install 'khorovod[nccl]')", allow_module_level=True)

SHARE = r'''
# The engine shares the id from inside a cycle, where nothing else uses the transport; here the
# transport stands alone (no engine), over TCP, as one round of the job joined it.
from horovod.common import bootstrap
from horovod.common.settings import Settings
from horovod.common.transport import TransportContext, create
from horovod.common.transport.nccl import library
from horovod.common.transport.nccl.transport import share_unique_id

settings = Settings.from_env()
membership = bootstrap.join(settings, 0)
settings = membership.settings_for(settings)
transport = create("tcp", TransportContext(membership.topology, settings, membership.rendezvous, membership.round))
nccl = library.load(library.find(settings).path)
made = []

def make():
    made.append(True)
    return nccl.unique_id()

rank = membership.topology.rank
everyone = share_unique_id(transport, [0, 1, 2], make)
pair = share_unique_id(transport, [1, 2], make) if rank in (1, 2) else b""
transport.exchange([0, 1, 2], b"")  # nobody leaves while another still reads
report(everyone=everyone.hex(), pair=pair.hex(), made=len(made))
transport.close()
membership.close()
'''


def test_the_first_member_makes_the_id_and_every_member_gets_it():
    result = hvdrun(SHARE, np=3).check()
    ids = [result.ranks[r]["everyone"] for r in range(3)]
    assert len(set(ids)) == 1 and len(bytes.fromhex(ids[0])) == library.UNIQUE_ID_BYTES
    assert result.ranks[1]["pair"] == result.ranks[2]["pair"] != ids[0]
    assert [result.ranks[r]["made"] for r in range(3)] == [1, 1, 0]  # rank 0 for all, rank 1 for the pair
