# broker/store/_record_check.c: the compiled record check (see its source for the contract)
from broker.store.results import Buffer

CRC_KERNEL: str  # "pclmulqdq" or "zlib"
WALK_END_OF_FILE: int
WALK_RANGE_END: int
WALK_BLANK: int
WALK_ZEROS: int
WALK_SHORT: int
WALK_BAD_SIZE: int
WALK_CROSSES_END: int
WALK_BAD_OFFSET: int
WALK_BAD_BLANK: int
WALK_BAD_MAGIC: int
WALK_FIELDS: int
WALK_ZEROED: int
WALK_BODY_CRC: int

def walk(buf: Buffer, file_from_offset: int, start: int, stop: int, /) -> tuple[int, int, int]: ...
