"""A small DeepSpeed training script: a plain PyTorch MLP on synthetic data.

It knows nothing of tuning: optuna-ds passes it a DeepSpeed config through --deepspeed_config
and DeepSpeed's engine measures the run and writes its metrics.

    deepspeed train.py --deepspeed_config ds_config.json
"""

import argparse

import deepspeed
import torch


class MLP(torch.nn.Module):
    """Linear layers with GELU between them; with ``checkpoint``, each hidden layer's activations
    are recomputed in the backward instead of kept (``deepspeed.checkpointing.checkpoint``)."""

    def __init__(self, hidden: int, layers: int, *, checkpoint: bool) -> None:
        super().__init__()
        self.first = torch.nn.Linear(hidden, hidden)
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.GELU(), torch.nn.Linear(hidden, hidden)) for _ in range(layers - 1))
        self.head = torch.nn.Sequential(torch.nn.GELU(), torch.nn.Linear(hidden, 10))
        self.checkpoint = checkpoint

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first(x)  # an input that requires grad: the checkpointed blocks recompute from it
        for block in self.blocks:
            x = deepspeed.checkpointing.checkpoint(block, x) if self.checkpoint else block(x)
        return self.head(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps to train")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--gradient_checkpointing", action="store_true",
                        help="recompute each layer's activations in the backward (DeepSpeed's activation checkpointing, "
                             "configured by the config's activation_checkpointing section)")
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = MLP(args.hidden, args.layers, checkpoint=args.gradient_checkpointing)
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    if args.gradient_checkpointing:
        deepspeed.checkpointing.configure(None, deepspeed_config=args.deepspeed_config)

    mbs = engine.train_micro_batch_size_per_gpu()
    dtype = next(engine.module.parameters()).dtype
    for step in range(args.steps):
        for _ in range(engine.gradient_accumulation_steps()):
            x = torch.randn(mbs, args.hidden, device=engine.device, dtype=dtype)
            y = torch.randint(0, 10, (mbs,), device=engine.device)
            loss = torch.nn.functional.cross_entropy(engine(x).float(), y)
            engine.backward(loss)
            engine.step()
        if engine.global_rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
