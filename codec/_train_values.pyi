# The C module's interface (codec/_train_values.c); codec/wire.py is the only place that imports it.
def train_values(pieces: tuple[bytes, bytes, bytes, bytes, bytes], samples: list[bytes],
                 raw_rewards: list[float], rewards: list[float], offsets: list[int],
                 /) -> list[bytes] | None: ...
