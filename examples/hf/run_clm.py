"""A Hugging Face Trainer causal-LM script in the style of transformers' run_clm.py.

The GPT-2 is built from a config (no download) and trained on synthetic token sequences, so it
runs anywhere; DeepSpeed comes in through the Trainer's --deepspeed ds_config.json.

    deepspeed run_clm.py --deepspeed ds_config.json --output_dir out --per_device_train_batch_size 4 --max_steps 20
"""

from __future__ import annotations

import dataclasses

import torch
from transformers import GPT2Config
from transformers import GPT2LMHeadModel
from transformers import HfArgumentParser
from transformers import Trainer
from transformers import TrainingArguments


@dataclasses.dataclass
class ModelArguments:
    model_size: str = dataclasses.field(default="tiny", metadata={"help": "tiny, small (gpt2), medium, large or xl"})
    block_size: int = dataclasses.field(default=64, metadata={"help": "tokens per sample"})
    num_samples: int = dataclasses.field(default=4096, metadata={"help": "synthetic training samples"})


SIZES = {
    "tiny": {"n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 1024},
    "small": {"n_layer": 12, "n_embd": 768, "n_head": 12},
    "medium": {"n_layer": 24, "n_embd": 1024, "n_head": 16},
    "large": {"n_layer": 36, "n_embd": 1280, "n_head": 20},
    "xl": {"n_layer": 48, "n_embd": 1600, "n_head": 25},
}


class SyntheticTokens(torch.utils.data.Dataset):
    """Random token sequences: the throughput of a training step does not depend on the text."""

    def __init__(self, *, num_samples: int, block_size: int, vocab_size: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, vocab_size, (num_samples, block_size), generator=generator)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.data[i], "labels": self.data[i]}


def main() -> None:
    model_args, training_args = HfArgumentParser((ModelArguments, TrainingArguments)).parse_args_into_dataclasses()
    size = SIZES[model_args.model_size]
    vocab = size.get("vocab_size", 50257)
    config = GPT2Config(n_positions=max(model_args.block_size, 128), bos_token_id=vocab - 1, eos_token_id=vocab - 1, **size)
    model = GPT2LMHeadModel(config)
    dataset = SyntheticTokens(num_samples=model_args.num_samples, block_size=model_args.block_size, vocab_size=config.vocab_size)
    trainer = Trainer(model=model, args=training_args, train_dataset=dataset)
    result = trainer.train()
    if training_args.process_index == 0:
        print(f"train_samples_per_second {result.metrics.get('train_samples_per_second')}", flush=True)


if __name__ == "__main__":
    main()
