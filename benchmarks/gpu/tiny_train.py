"""The tuning's job on the GPU: a small GPT (about 21M parameters, bf16) on synthetic tokens.

It knows nothing of tuning, like ``examples/train.py``: the DeepSpeed config comes through
``--deepspeed_config`` and the engine measures the profiled steps and writes its metrics.

    optuna-ds tune --num_gpus 1 tiny_train.py --deepspeed_config tiny_ds_config.json
"""
import argparse

import deepspeed
import torch

from gpt import GPT
from gpt import batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps to train")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=8192)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = GPT(vocab=args.vocab, hidden=args.hidden, layers=args.layers, heads=args.hidden // 64, seq=args.seq)
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    for step in range(args.steps):
        for _ in range(engine.gradient_accumulation_steps()):
            loss = engine(batch(engine, engine.train_micro_batch_size_per_gpu(), vocab=args.vocab, seq=args.seq))
            engine.backward(loss)
            engine.step()
        if engine.global_rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
