import sys
from pathlib import Path

# the Megatron engine's golden assets and the tiny DeepSeek-V3 config
HERE = Path(__file__).resolve().parent
for sub in ("megatron_engine", "train_engine"):
    p = str(HERE.parent / sub)
    if p not in sys.path:
        sys.path.insert(0, p)
