"""Peak GPU memory of a GPT-2 124M training step at 64K tokens with attention=flash, per mask, and which
allocations are live at the peak (torch.cuda.memory snapshot). Eager, bf16 autocast, batch 1.

    python results/tuning/h200-2026-11-27-mask-memory/mem_probe.py [--seq-len 65536] [--no-grad-eval]
"""

import argparse
import collections

import torch

from flashgpt.model.attention import AttentionConfig
from flashgpt.model.gpt import GPT, ModelConfig
from flashgpt.model.sparsity import BlockSparseConfig


def documents(seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """(1, T) ids of documents of 10K-60K tokens packed end to end."""
    lengths = []
    while sum(lengths) < seq_len:
        lengths.append(int(torch.randint(10_000, 60_000, (1,), generator=generator)))
    ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[:seq_len]
    return ids[None]


def live_at_peak(snapshot: dict, top: int = 12) -> list[str]:
    """The largest allocations live when allocated memory peaked, with the Python frame that made each."""
    live, total, best, best_live = {}, 0, -1, {}
    for trace in snapshot["device_traces"]:
        for event in trace:
            if event["action"] == "alloc":
                live[event["addr"]] = event
                total += event["size"]
                if total > best:
                    best, best_live = total, dict(live)
            elif event["action"] == "free_completed" and event["addr"] in live:
                total -= live.pop(event["addr"])["size"]
    by_site = collections.Counter()
    for event in best_live.values():
        frames = [f for f in event.get("frames", []) if "flashgpt" in f["filename"] or "mem_probe" in f["filename"]]
        site = " < ".join(f"{f['filename'].split('/')[-1]}:{f['line']} {f['name']}" for f in frames[:3]) or "?"
        by_site[site] += event["size"]
    lines = [f"peak of traced allocations: {best / 2**30:.2f} GiB"]
    lines += [f"  {size / 2**30:7.3f} GiB  {site}" for site, size in by_site.most_common(top)]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq-len", type=int, default=65536)
    args = parser.parse_args()
    cases = {
        "dense": {},
        "documents": {"documents": True},
        "strided10": {"block_sparse": BlockSparseConfig(pattern="strided", density=0.1)},
        "window4k": {"window_size": 4096},
    }
    for name, case in cases.items():
        attention = AttentionConfig(
            "flash", window_size=case.get("window_size"), block_sparse=case.get("block_sparse", BlockSparseConfig())
        )
        torch.manual_seed(0)
        model = GPT(ModelConfig(), args.seq_len, attention).cuda()
        generator = torch.Generator().manual_seed(0)
        idx = torch.randint(0, 50257, (1, args.seq_len), generator=generator).cuda()
        doc_ids = documents(args.seq_len, generator).cuda() if case.get("documents") else None
        for step in range(2):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            if step == 1:
                torch.cuda.memory._record_memory_history(max_entries=200_000)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(idx, idx, document_ids=doc_ids)
            after_forward = torch.cuda.max_memory_allocated()
            loss.backward()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
            print(f"{name:10s} step {step}: weights+grads {base / 2**30:.2f} GiB, peak in forward "
                  f"{after_forward / 2**30:.2f}, peak {peak / 2**30:.2f}", flush=True)  # fmt: skip
            if step == 1:
                snapshot = torch.cuda.memory._snapshot()
                torch.cuda.memory._record_memory_history(enabled=None)
                print("\n".join(live_at_peak(snapshot)), flush=True)
        del model, loss, idx, doc_ids
        torch.cuda.empty_cache()
        print(f"{name:10s} after freeing the model: {torch.cuda.memory_allocated() / 2**30:.2f} GiB still allocated")


if __name__ == "__main__":
    main()
