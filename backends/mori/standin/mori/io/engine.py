"""Stand-in for ``mori/io/engine.py`` (amd-mori 1.2.4): snake_case wrappers over ``mori.cpp``.

Like the real file, the transfer methods take their arguments positionally
(``*args``); keyword calls fail here as they fail on the real engine.  Unlike
the real file, ``torch`` is imported only by ``register_torch_tensor``.
"""

import ctypes

from mori import cpp as mori_cpp

_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

TORCH_DEVICE_TYPE_MAP = {
    "cpu": mori_cpp.MemoryLocationType.CPU,
    "cuda": mori_cpp.MemoryLocationType.GPU,
}


class IOEngineSession:
    """Mirrors ``mori.io.IOEngineSession``: wrapper over ``mori.cpp.IOEngineSession``.

    * ``allocate_transfer_uid() -> int``
    * ``read/write(local_offset, remote_offset, size, transfer_uid) -> TransferStatus``
    * ``batch_read/batch_write(local_offsets, remote_offsets, sizes, transfer_uid)
      -> TransferStatus`` (one status for the batch)
    * ``alive() -> bool``

    Offsets and sizes are in bytes.
    """

    def __init__(self, mori_sess):
        self._sess = mori_sess

    def allocate_transfer_uid(self):
        return self._sess.AllocateTransferUniqueId()

    def _one(self, func, local_offset, remote_offset, size, transfer_uid):
        status = mori_cpp.TransferStatus()
        func(local_offset, remote_offset, size, status, transfer_uid)
        return status

    def read(self, *args):
        return self._one(self._sess.Read, *args)

    def write(self, *args):
        return self._one(self._sess.Write, *args)

    def batch_read(self, *args):
        return self._one(self._sess.BatchRead, *args)

    def batch_write(self, *args):
        return self._one(self._sess.BatchWrite, *args)

    def alive(self):
        return self._sess.Alive()


class IOEngine:
    """Mirrors ``mori.io.IOEngine(key, config: IOEngineConfig)`` of amd-mori 1.2.4.

    Methods (positional order as in the real wrapper):

    * ``get_engine_desc() -> EngineDesc`` (``.key``, ``.port`` > 0, ``.pack()``)
    * ``create_backend(type, config=None)`` (None: the type's default config);
      ``remove_backend(type)``
    * ``register_remote_engine(engine_desc)``, ``deregister_remote_engine(engine_desc)``
    * ``register_memory(ptr, size, device_id, mem_loc) -> MemoryDesc`` (``size``
      in bytes; raises RuntimeError for a null ptr or size <= 0);
      ``register_torch_tensor(tensor) -> MemoryDesc``; ``deregister_memory(mem_desc)``
    * ``allocate_transfer_uid() -> int``
    * ``read/write(local_desc, local_offset, remote_desc, remote_offset, size,
      transfer_uid) -> TransferStatus``
    * ``batch_read/batch_write(local_descs, local_offsets, remote_descs,
      remote_offsets, sizes, transfer_uids) -> list[TransferStatus]`` -- one
      status per entry of ``sizes``; ``local_offsets[i]``, ``remote_offsets[i]``,
      ``sizes[i]`` are lists of byte counts for transfer ``i``
    * ``create_session(local_mem, remote_mem) -> IOEngineSession | None``
    * ``pop_inbound_transfer_status(remote_key, transfer_uid) -> TransferStatus | None``
      (status of a transfer a peer ran into this engine)
    * ``pop_peer_failure() -> PeerFailureEvent | None``
    * ``wait_all(statuses, timeout_ms=-1) -> StatusCode``

    Transfers are asynchronous: statuses come back IN_PROGRESS (or already
    failed, for bad arguments) and turn SUCCESS / ERR_* later.  The engine
    stops when this object is destroyed; ``standin_close()`` (stand-in only)
    stops it at once.
    """

    def __init__(self, key, config):
        self._engine = mori_cpp.IOEngine(key, config)

    def get_engine_desc(self):
        return self._engine.GetEngineDesc()

    def create_backend(self, type, config=None):
        if config is None:
            if type is mori_cpp.BackendType.RDMA:
                config = mori_cpp.RdmaBackendConfig()
            elif type is mori_cpp.BackendType.XGMI:
                config = mori_cpp.XgmiBackendConfig()
            elif type is mori_cpp.BackendType.FABRIC:
                config = mori_cpp.FabricBackendConfig()
            else:
                raise NotImplementedError("backend not implemented yet")
        return self._engine.CreateBackend(type, config)

    def remove_backend(self, type):
        return self._engine.RemoveBackend(type)

    def register_remote_engine(self, engine_desc):
        return self._engine.RegisterRemoteEngine(engine_desc)

    def deregister_remote_engine(self, engine_desc):
        return self._engine.DeregisterRemoteEngine(engine_desc)

    def register_memory(self, ptr, size, device_id, mem_loc):
        data = _PyCapsule_New(ctypes.c_void_p(ptr), None, None)
        return self._engine.RegisterMemory(data, size, device_id, mem_loc)

    def register_torch_tensor(self, tensor):
        if not tensor.is_contiguous():
            raise RuntimeError("input tensor must be contiguous")
        total_bytes = tensor.nelement() * tensor.element_size()
        device_id = tensor.device.index
        if device_id is None:
            device_id = -1
        mem_loc = TORCH_DEVICE_TYPE_MAP[tensor.device.type]
        return self.register_memory(tensor.data_ptr(), total_bytes, device_id, mem_loc)

    def deregister_memory(self, mem_desc):
        return self._engine.DeregisterMemory(mem_desc)

    def allocate_transfer_uid(self):
        return self._engine.AllocateTransferUniqueId()

    def _one(self, func, local_desc, local_offset, remote_desc, remote_offset, size, transfer_uid):
        status = mori_cpp.TransferStatus()
        func(local_desc, local_offset, remote_desc, remote_offset, size, status, transfer_uid)
        return status

    def read(self, *args):
        return self._one(self._engine.Read, *args)

    def write(self, *args):
        return self._one(self._engine.Write, *args)

    def _batch(self, func, local_descs, local_offsets, remote_descs, remote_offsets, sizes, transfer_uids):
        statuses = [mori_cpp.TransferStatus() for _ in range(len(sizes))]
        func(local_descs, local_offsets, remote_descs, remote_offsets, sizes, statuses, transfer_uids)
        return statuses

    def batch_read(self, *args):
        return self._batch(self._engine.BatchRead, *args)

    def batch_write(self, *args):
        return self._batch(self._engine.BatchWrite, *args)

    def create_session(self, local_mem, remote_mem):
        sess = self._engine.CreateSession(local_mem, remote_mem)
        if sess is None:
            return None
        return IOEngineSession(sess)

    def pop_inbound_transfer_status(self, remote_key, transfer_uid):
        status = mori_cpp.TransferStatus()
        if self._engine.PopInboundTransferStatus(remote_key, transfer_uid, status):
            return status
        return None

    def pop_peer_failure(self):
        """Take the oldest pending peer failure, or None if nothing has failed."""
        return self._engine.PopPeerFailure()

    def wait_all(self, statuses, timeout_ms: int = -1):
        """Block until no status is IN_PROGRESS or ``timeout_ms`` ms pass.

        Returns a StatusCode: the first failure's code, else IN_PROGRESS on
        timeout, else SUCCESS.  ``timeout_ms=-1`` waits up to the stand-in cap
        (``mori.cpp.STANDIN_MAX_WAIT_MS``) instead of for ever.
        """
        return self._engine.WaitAll(statuses, timeout_ms)

    def standin_close(self):
        """STAND-IN ONLY: stop the engine now (see ``mori.cpp.IOEngine.standin_close``)."""
        self._engine.standin_close()
