"""Domain errors. The CLI turns these into one line on stderr and exit code 2."""


class ColdkvError(Exception):
    """Base class for errors a user can act on (bad input, missing files, not enough memory)."""


class ModelLoadError(ColdkvError):
    """A checkpoint is missing, malformed or uses an unsupported architecture."""


class PlanError(ColdkvError):
    """A request does not fit: the message says what is needed, what is available, what to try."""


class KVTableError(ColdkvError):
    """An unknown KV table name, or a malformed --kv-table file."""


class DeviceError(ColdkvError):
    """The requested device or backend is not available."""


class InputError(ColdkvError):
    """An input file (a prompt) is missing or unreadable."""
