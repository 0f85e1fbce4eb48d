"""How the actors' messages travel between our own processes: pickle, protocol 5.

The actors run the same code version, so the messages need no stable format (the SQLite store
keeps the msgpack codec, common/codec.py, for that). The C pickler is several times faster than a
per-field Python encoder, and its memo writes an object shared by many units of a batch (a job's
TaskGroup, a node name) once per message.
"""

import pickle

PROTOCOL = 5


def pack(obj: object) -> bytes:
    return pickle.dumps(obj, protocol=PROTOCOL)


def unpack(data: bytes) -> object:
    return pickle.loads(data)  # only ever bytes our own actors packed
