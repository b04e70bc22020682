"""What a fresh 100 MiB tensor costs (allocate and fill: every page faulted in) with and
without a resident ballast of N GiB, as a tiered run's host tier leaves RAM (benchmarks/
capacity.md, 2026-11-28).

    .venv/bin/python benchmarks/fresh_pages.py 18
"""

import sys
import time

import torch


def fresh_ms(numel: int = 26_214_400, reps: int = 20) -> float:
    start = time.perf_counter()
    for _ in range(reps):
        x = torch.empty(numel)
        x.fill_(1.0)
        del x
    return 1e3 * (time.perf_counter() - start) / reps


def available_gib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def main() -> None:
    torch.set_num_threads(2)
    gib = int(sys.argv[1]) if len(sys.argv) > 1 else 18
    print(f"no ballast: {fresh_ms():.1f} ms (MemAvailable {available_gib():.1f} GiB)")
    ballast = [torch.ones(1 << 28) for _ in range(gib)]  # 1 GiB each, every page touched
    print(f"{gib} GiB ballast: {fresh_ms():.1f} ms (MemAvailable {available_gib():.1f} GiB)")
    del ballast
    print(f"ballast freed: {fresh_ms():.1f} ms")


if __name__ == "__main__":
    main()
