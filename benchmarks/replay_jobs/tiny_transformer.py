"""A plain DeepSpeed script: a tiny transformer language model (~3.7M parameters: 4 layers,
width 256, sequences of 16 tokens) on random tokens.

One of the scripts benchmarks/record_real.py records; it knows nothing of tuning.

    deepspeed tiny_transformer.py --deepspeed_config ds_config.json
"""

import argparse

import deepspeed
import torch


class TinyLM(torch.nn.Module):
    def __init__(self, *, vocab: int, width: int, layers: int, seq: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Parameter(torch.zeros(seq, width))
        layer = torch.nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=4 * width, batch_first=True)
        self.body = torch.nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(tokens) + self.position))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=16)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = TinyLM(vocab=args.vocab, width=args.width, layers=args.layers, seq=args.seq)
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())

    mbs = engine.train_micro_batch_size_per_gpu()
    for _ in range(args.steps):
        for _ in range(engine.gradient_accumulation_steps()):
            tokens = torch.randint(0, args.vocab, (mbs, args.seq + 1), device=engine.device)
            logits = engine(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
            engine.backward(loss)
            engine.step()


if __name__ == "__main__":
    main()
