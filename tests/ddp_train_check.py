"""Run under torchrun by tests/test_train.py: train, then save this rank's parameters."""

import json
import os
import sys
from pathlib import Path

from safetensors.torch import save_file

from txl.train import TrainArgs, train

if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    model = train(TrainArgs(**spec["train"]), spec["model"])
    rank = os.environ["RANK"]
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    save_file(state, Path(spec["train"]["out"]) / f"params.rank{rank}.safetensors")
