"""A small DeepSpeed training script: a plain PyTorch MLP on synthetic data.

It knows nothing of tuning: optuna-ds passes it a DeepSpeed config through --deepspeed_config
and DeepSpeed's engine measures the run and writes its metrics.

    deepspeed train.py --deepspeed_config ds_config.json
"""

import argparse

import deepspeed
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps to train")
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
