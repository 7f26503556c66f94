#!/usr/bin/env python3
"""Writes the ten benchmark traces (CSV `second,arrivals`) into traces/ next to this script.

Deterministic: a fixed seed per trace, Python's Mersenne Twister (stable across Python versions).
The committed CSVs are what the benchmark reads; rerun this only to change the traffic on purpose.
"""
import math
import os
import random

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "traces")


def poisson(rng, lam):
    if lam <= 0:
        return 0
    if lam > 30:  # normal approximation, fine at these rates
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def write(name, counts, comment):
    with open(os.path.join(HERE, name + ".csv"), "w") as f:
        f.write(f"# {comment}\n")
        f.write("second,arrivals\n")
        for s, n in enumerate(counts):
            if n:
                f.write(f"{s},{n}\n")
        # the last second is always listed, so the trace's length survives sparse writing
        if not counts[-1]:
            f.write(f"{len(counts) - 1},0\n")


def step():
    rng = random.Random(1)
    rate = lambda s: 0 if s < 600 else 30 if s < 1500 else 150 if s < 2400 else 30 if s < 3300 else 0
    return [poisson(rng, rate(s)) for s in range(4500)]


def burst():
    rng = random.Random(2)
    counts = [poisson(rng, 8) if s < 4800 else 0 for s in range(5400)]
    for start in (900, 2100, 3300):
        for s in range(start, start + 3):
            counts[s] += 1000
    return counts


def diurnal():
    rng = random.Random(3)
    counts, factor = [], 1.0
    for s in range(86400):
        if s % 60 == 0:
            factor = rng.uniform(0.9, 1.1)
        lam = (2 + 48 * (1 - math.cos(2 * math.pi * s / 86400)) / 2) * factor
        counts.append(poisson(rng, lam))
    return counts


def spiky():
    rng = random.Random(4)
    rates = [20.0 if s < 6600 else 0.0 for s in range(7200)]
    s = 300
    while s < 6400:
        length, mult = rng.randint(10, 60), rng.uniform(3, 8)
        for t in range(s, min(s + length, 6600)):
            rates[t] *= mult
        s += length + rng.randint(120, 480)
    return [poisson(rng, r) for r in rates]


def idle():
    rng = random.Random(5)
    counts = [0] * 21600
    s = int(rng.expovariate(1 / 1200))
    while s < 21000:
        counts[s] += rng.randint(1, 3)
        s += 1 + int(rng.expovariate(1 / 1200))
    return counts


def surge():
    """A sudden 20x spike with a long tail: 5/s, then 100/s for 2 min falling back over ~20 min."""
    rng = random.Random(6)
    counts = []
    for s in range(5400):
        if s < 1200 or s >= 4800:
            lam = 5.0 if s < 4800 else 0.0
        elif s < 1320:
            lam = 100.0
        else:
            lam = 5.0 + 95.0 * math.exp(-(s - 1320) / 400.0)
        counts.append(poisson(rng, lam))
    return counts


def ramps():
    """Repeated ramps: 0 to 80/s over 10 min, a sudden stop, 3 min idle; five times."""
    rng = random.Random(7)
    counts = []
    for _ in range(5):
        counts += [poisson(rng, 80.0 * s / 600) for s in range(600)]
        counts += [0] * 180
    counts += [0] * 600
    return counts


def night():
    """A near-idle night: 8 h with single messages every few minutes (exponential gaps, mean 4 min)."""
    rng = random.Random(8)
    counts = [0] * 28800
    s = int(rng.expovariate(1 / 240))
    while s < 28200:
        counts[s] += 1
        s += 1 + int(rng.expovariate(1 / 240))
    return counts


def sawtooth(seed, cycles, period, low, high):
    """Sawtooth load: the rate climbs linearly from low to high over each period, then drops straight back
    to low; `cycles` times with no pause between them, then 10 min idle."""
    rng = random.Random(seed)
    counts = []
    for _ in range(cycles):
        counts += [poisson(rng, low + (high - low) * s / period) for s in range(period)]
    counts += [0] * 600
    return counts


if __name__ == "__main__":
    os.makedirs(HERE, exist_ok=True)
    write("step", step(), "step: idle 10 min, 30/s for 15 min, 150/s for 15 min, 30/s for 15 min, idle 20 min")
    write("burst", burst(), "burst: 8/s for 80 min with 3000 messages in 3 s at 15, 35 and 55 min; idle 10 min")
    write("diurnal", diurnal(), "diurnal: 24 h, 2/s at midnight to 50/s at noon, +-10 % per minute")
    write("spiky", spiky(), "spiky: 20/s with 10-60 s spikes of 3-8x every 2-8 min, 110 min; idle 10 min")
    write("idle", idle(), "idle: 6 h with 1-3 messages every ~20 min (exponential gaps)")
    write("surge", surge(), "surge: 5/s, at 20 min a 20x spike (100/s for 2 min) with a tail back to 5/s over ~20 min, 80 min; idle 10 min")
    write("ramps", ramps(), "ramps: five times 0 to 80/s over 10 min then a sudden stop and 3 min idle; idle 10 min")
    write("night", night(), "night: 8 h with single messages every ~4 min (exponential gaps)")
    write("sawtooth", sawtooth(9, 12, 300, 5.0, 60.0),
          "sawtooth: 5/s climbing to 60/s over 5 min then back to 5/s at once, twelve times (60 min); idle 10 min")
    write("sawtooth-slow", sawtooth(10, 6, 900, 10.0, 80.0),
          "sawtooth-slow: 10/s climbing to 80/s over 15 min then back to 10/s at once, six times (90 min); idle 10 min")
