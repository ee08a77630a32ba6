"""A plain DeepSpeed script: an MLP (by default 4 layers of 512, ~1M parameters) on synthetic data.

One of the scripts benchmarks/record_real.py records; it knows nothing of tuning.

    deepspeed mlp.py --deepspeed_config ds_config.json
"""

import argparse

import deepspeed
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()

    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.hidden, args.hidden), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(args.hidden, 10))
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())

    mbs = engine.train_micro_batch_size_per_gpu()
    dtype = next(engine.module.parameters()).dtype
    for _ in range(args.steps):
        for _ in range(engine.gradient_accumulation_steps()):
            x = torch.randn(mbs, args.hidden, device=engine.device, dtype=dtype)
            y = torch.randint(0, 10, (mbs,), device=engine.device)
            loss = torch.nn.functional.cross_entropy(engine(x).float(), y)
            engine.backward(loss)
            engine.step()


if __name__ == "__main__":
    main()
