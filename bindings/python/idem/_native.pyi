# The types of idem._native, which cffi generates (see _backend/idem_cdef.py).
from typing import Any

ffi: Any
lib: Any
