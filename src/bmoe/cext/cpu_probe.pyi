SUPPORTED: bool
CPUID_AMX_TILE: int
CPUID_AMX_INT8: int
CPUID_AMX_BF16: int
XCR0_TILE_CONFIG: int
XCR0_TILE_DATA: int
TILES_OK: int
TILES_WRONG: int
TILES_UNSUPPORTED: int

def amx_cpuid() -> int: ...
def xcr0() -> int: ...
def request_amx_permission() -> bool: ...
def run_amx_tiles() -> int: ...
