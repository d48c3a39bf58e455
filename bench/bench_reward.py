"""Benchmark the deepscaler reward against math-verify and the vendor's substring rule.

One training step's worth of responses (512 prompts x 16 samples = 8192) is generated with known
labels: each answer is either an equivalent rendering of the ground truth or a wrong one, wrapped
in `<think>...</think>` responses; a small share is adversarial (unclosed reasoning, a right answer
only inside the reasoning, power towers, deep nesting, 100 kB responses, slow sympy inputs) or a
reward hack (a bound of a sum, one side of an equation, alternatives joined by "or", percent on
both sides, values below 5e-7).

The format rule is DeepScaleR's and R1-Zero's (our default): no `</think>`, or no box after the last
`</think>`, scores 0 and is labelled 0. Both graders see it: math-verify is asked only about
responses that pass it (the rule is re-implemented here), and the agreement figure leaves the
format cases out (they agree by construction; their count is printed).

Measured side by side in one run, with the same number of worker processes for both:
- ours: `grade_batch` (fast path in-process, symbolic checks in guarded worker processes), cold
  (workers started inside the timed region) and warm;
- math-verify: verl's own integration `verl.utils.reward_score.math_verify.compute_score` (its
  signal-based timeouts need a main thread, so it runs in a process pool);
- the vendor rule re-implemented from its description: 1 if the ground truth is a substring of the
  response or equals the last boxed content.

Goals (issues 3 and 17): agreement with math-verify >= 99 % on non-adversarial items that pass the
format rule, and our cold wall time over all items <= 0.2 x math-verify's in the same run.
Usage: .venv/bin/python bench/bench_reward.py [--n 8192] [--workers N]
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verl_patches.reward.deepscaler import clear_caches, grade, grade_batch  # noqa: E402
from verl_patches.reward.guarded_pool import GuardedPool, PoolConfig  # noqa: E402

# Our cold wall time over all items, as a fraction of math-verify's in the same run (issue 17).
TIME_RATIO_GOAL = 0.2


@dataclass(frozen=True)
class Item:
    response: str
    truth: str
    label: float  # 1.0: the final answer is equivalent to the truth
    category: str
    adversarial: bool
    format_ok: bool = True  # passes the R1-Zero format rule (`r1_zero_format_ok`)


# --- answer renderings ------------------------------------------------------------------------------


def _frac(p: int, q: int) -> str:
    sign = "-" if p * q < 0 else ""
    return f"{sign}\\frac{{{abs(p)}}}{{{abs(q)}}}"


def problem_integer(rng: random.Random):
    n = rng.choice([rng.randint(0, 99), rng.randint(100, 9999), rng.randint(10_000, 10**7)])
    right = [
        str(n),
        f"{n}",
        f"{n:,}" if n >= 1000 else str(n),
        f"{n:,}".replace(",", "{,}"),
        f"x = {n}",
        f"{n}.0",
        f"\\text{{{n}}}",
    ]
    wrong = [str(n + rng.randint(1, 9)), str(n - rng.randint(1, 9)), str(n * 10 + 1), str(-n - 1), str(n)[::-1] + "1"]
    return str(n), right, wrong


def problem_fraction(rng: random.Random):
    q = rng.randint(2, 40)
    p = rng.choice([k for k in range(1, 3 * q) if Fraction(k, q).denominator == q] or [1])
    if rng.random() < 0.3:
        p = -p
    value = Fraction(p, q)
    right = [
        _frac(p, q),
        _frac(p, q).replace("\\frac", "\\dfrac"),
        f"{p}/{q}",
        _frac(2 * p, 2 * q),
        _frac(3 * p, 3 * q).replace("\\frac", "\\tfrac"),
    ]
    if 10**6 % q == 0:
        right.append(str(float(value)))
    wrong = [_frac(q, p), _frac(p + 1, q), _frac(p, q + 1), str(round(float(value)) + 7)]
    if (value * 100).denominator != 1:
        wrong.append(f"{float(value):.2f}")  # a rounded decimal, not the exact value
    return _frac(p, q), right, wrong


def problem_decimal(rng: random.Random):
    value = Fraction(rng.randint(1, 9999), 100)
    text = f"{float(value):.2f}"
    right = [
        text,
        text.rstrip("0").rstrip(".") if "." in text else text,
        _frac(value.numerator, value.denominator),
        f"{value.numerator}/{value.denominator}",
    ]
    wrong = [f"{float(value) + 0.01:.2f}", f"{float(value) * 10:.2f}", f"{float(value) + 1:.1f}"]
    return text, right, wrong


def problem_sqrt(rng: random.Random):
    a, b = rng.randint(2, 9), rng.choice([2, 3, 5, 6, 7, 10, 11, 13])
    right = [f"{a}\\sqrt{{{b}}}", f"\\sqrt{{{a * a * b}}}", f"{a} \\sqrt{{ {b} }}"]
    if b < 10:  # `\sqrt 13` is \sqrt{1}3 in LaTeX: the unbraced form only works for one digit
        right += [f"{a} \\sqrt {b}", f"{a}\\sqrt{b}"]
    wrong = [
        f"{a + 1}\\sqrt{{{b}}}",
        f"{b}\\sqrt{{{a}}}" if a != b else f"{a}\\sqrt{{{b + 1}}}",
        f"\\sqrt{{{a * b}}}",
        str(a * b),
    ]
    return f"{a}\\sqrt{{{b}}}", right, wrong


def problem_pi(rng: random.Random):
    k, m = rng.choice([(1, 2), (1, 3), (2, 3), (1, 4), (3, 4), (1, 6), (5, 6), (3, 2)])
    num = "\\pi" if k == 1 else f"{k}\\pi"
    right = [f"\\frac{{{num}}}{{{m}}}", f"\\dfrac{{{num}}}{{{m}}}", f"{num}/{m}", f"\\frac{{{k}}}{{{m}}}\\pi"]
    wrong = [f"\\frac{{{num}}}{{{m + 1}}}", f"\\frac{{{k + 1}\\pi}}{{{m}}}", f"{k}\\pi", f"\\frac{{{k}}}{{{m}}}"]
    return f"\\frac{{{num}}}{{{m}}}", right, wrong


def problem_interval(rng: random.Random):
    a = rng.randint(-10, 5)
    b = a + rng.randint(1, 10)
    lo, hi = rng.choice("(["), rng.choice(")]")
    truth = f"{lo}{a}, {b}{hi}"
    right = [truth, f"{lo}{a},{b}{hi}", f"\\left{lo}{a}, {b}\\right{hi}"]
    flip_lo, flip_hi = {"(": "[", "[": "("}[lo], {")": "]", "]": ")"}[hi]
    wrong = [f"{flip_lo}{a}, {b}{hi}", f"{lo}{a}, {b}{flip_hi}", f"{lo}{a}, {b + 1}{hi}", f"{lo}{a - 1}, {b}{hi}"]
    return truth, right, wrong


def problem_tuple(rng: random.Random):
    a, b = rng.randint(-9, 9), rng.randint(-9, 9)
    while b == a:
        b = rng.randint(-9, 9)
    lo, hi = (a, b) if a < b else (b, a)
    # An increasing pair is also read as an open interval by math-verify; keep points non-increasing.
    a, b = hi, lo
    truth = f"({a}, {b})"
    right = [truth, f"({a},{b})", f"\\left({a}, {b}\\right)"]
    wrong = [f"({b}, {a})", f"({a}, {b + 1})", f"({a}, {b}, 0)"]
    return truth, right, wrong


def problem_set(rng: random.Random):
    values = rng.sample(range(-9, 20), 3)
    truth = "\\{" + ", ".join(map(str, sorted(values))) + "\\}"
    shuffled = values[:]
    rng.shuffle(shuffled)
    right = [
        truth,
        "\\{" + ",".join(map(str, shuffled)) + "\\}",
        "\\left\\{" + ", ".join(map(str, shuffled)) + "\\right\\}",
    ]
    wrong = [
        "\\{" + ", ".join(map(str, values[:2])) + "\\}",
        "\\{" + ", ".join(map(str, values[:2] + [values[2] + 1])) + "\\}",
    ]
    return truth, right, wrong


def problem_degrees(rng: random.Random):
    k = rng.choice([15, 30, 36, 45, 60, 72, 90, 108, 120, 135, 150])
    right = [f"{k}^\\circ", f"{k}^{{\\circ}}", str(k)]
    wrong = [f"{k + 5}^\\circ", f"{k * 2}", f"{180 - k}^\\circ" if k != 90 else "45"]
    return str(k), right, wrong


def problem_scientific(rng: random.Random):
    mantissa, exponent = rng.choice([(15, 2), (25, 3), (12, 4), (75, 2), (32, 5)])
    value = mantissa * 10 ** (exponent - 1)
    m = f"{mantissa // 10}.{mantissa % 10}"
    right = [str(value), f"{m} \\times 10^{{{exponent}}}", f"{m}\\times10^{exponent}", f"{m}e{exponent}"]
    wrong = [f"{m} \\times 10^{{{exponent + 1}}}", str(value + 1), f"{m}"]
    return str(value), right, wrong


def problem_polynomial(rng: random.Random):
    a = rng.randint(1, 6)
    truth = f"x^2+{2 * a}x+{a * a}"
    right = [truth, f"(x+{a})^2", f"{a * a}+{2 * a}x+x^2", f"x^{{2}} + {2 * a} x + {a * a}"]
    wrong = [f"x^2+{a * a}", f"(x-{a})^2", f"x^2+{a}x+{a * a}", f"(x+{a + 1})^2"]
    return truth, right, wrong


def problem_choice(rng: random.Random):
    letter = rng.choice("ABCDE")
    right = [letter, f"\\text{{({letter})}}", f"({letter})", f"\\text{{{letter}}}"]
    wrong = [c for c in "ABCDE" if c != letter]
    return f"\\text{{({letter})}}", right, wrong


def problem_percent(rng: random.Random):
    k = rng.randint(1, 99)
    return str(k), [f"{k}\\%", f"{k}%"], [f"{k + 1}\\%", f"{k / 100 + 1}"]


def problem_units(rng: random.Random):
    n = rng.randint(2, 500)
    unit = rng.choice(["cm", "meters", "inches", "dollars", "square units"])
    right = [f"{n}\\text{{ {unit}}}", f"{n} \\text{{{unit}}}", f"\\text{{{n} {unit}}}", str(n)]
    wrong = [f"{n + 1}\\text{{ {unit}}}", f"{n * 2} \\text{{{unit}}}"]
    return str(n), right, wrong


# (generator, weight): weights follow what a math RL data set looks like (mostly numbers).
CATEGORIES = [
    (problem_integer, 45),
    (problem_fraction, 14),
    (problem_decimal, 5),
    (problem_sqrt, 7),
    (problem_pi, 5),
    (problem_interval, 4),
    (problem_tuple, 3),
    (problem_set, 3),
    (problem_degrees, 3),
    (problem_scientific, 2),
    (problem_polynomial, 4),
    (problem_choice, 3),
    (problem_units, 2),
    (problem_percent, 0.5),
]

CHATTER = [
    "Let me compute 3 + 4 = 7 first.",
    "Multiplying both sides by 2 gives 14.",
    "We check the case n = 5 separately.",
    "So the remainder is 1 after division by 3.",
    "Substituting back, the equation holds.",
    "This means the area doubles when the side grows by 41 percent.",
]


def wrap(rng: random.Random, answer: str) -> str:
    reasoning = " ".join(rng.sample(CHATTER, rng.randint(1, 4)))
    style = rng.random()
    if style < 0.42:
        return f"<think>{reasoning}</think>\n\nThe final answer is $\\boxed{{{answer}}}$."
    if style < 0.72:
        return f"<think>{reasoning}</think> \\boxed{{{answer}}}"
    if style < 0.87:
        return f"{reasoning}</think> So we get \\boxed{{{answer}}}."
    if style < 0.95:  # no box after </think>: 0 under the format rule
        return f"<think>{reasoning}</think> Therefore, the answer is ${answer}$."
    return f"{reasoning} So the answer is \\boxed{{{answer}}}."  # no </think>: 0 under the format rule


def r1_zero_format_ok(response: str) -> bool:
    """DeepScaleR's and R1-Zero's format rule, written out independently for the baseline grader."""
    if "</think>" not in response:
        return False
    tail = response.rsplit("</think>", 1)[1]
    return "<think>" not in tail and ("\\boxed" in tail or "\\fbox" in tail)


def boxed_response(rng: random.Random, answer: str) -> str:
    return f"<think>{' '.join(rng.sample(CHATTER, 2))}</think> \\boxed{{{answer}}}"


def reward_hack(rng: random.Random) -> tuple[str, str, str]:
    """(response, truth, kind) of a wrong answer a policy could learn to exploit; every label is 0."""
    kind = rng.randrange(5)
    t = rng.randint(2, 40)
    if kind == 0:
        return boxed_response(rng, "1"), f"\\sum_{{k=1}}^{{{t}}} k", "hack_sum_bound"
    if kind == 1:
        return boxed_response(rng, str(t)), f"x + y = {t}", "hack_equation_side"
    if kind == 2:
        return boxed_response(rng, f"x = {t + 1} \\text{{ or }} x = {t}"), str(t), "hack_hedge_or"
    if kind == 3:
        return boxed_response(rng, f"{t}\\%"), f"{t / 100}\\%", "hack_percent_both_sides"
    return boxed_response(rng, f"0.000000{rng.randint(1, 4)}"), f"0.000000{rng.randint(5, 9)}", "hack_tiny_values"


def adversarial(rng: random.Random, truth: str) -> tuple[str, str, float, str]:
    """(response, truth, label, kind)."""
    kind = rng.randrange(13)
    if kind >= 8:
        response, hacked_truth, name = reward_hack(rng)
        return response, hacked_truth, 0.0, name
    response, label, name = _classic_adversarial(rng, truth, kind)
    return response, truth, label, name


def _classic_adversarial(rng: random.Random, truth: str, kind: int) -> tuple[str, float, str]:
    if kind == 0:
        return f"<think>clearly \\boxed{{{truth}}} is right", 0.0, "adv_unclosed_think"
    if kind == 1:
        return f"<think>maybe \\boxed{{{truth}}}</think> \\boxed{{{truth}1}}", 0.0, "adv_answer_in_think"
    if kind == 2:
        return wrap(rng, "2^{10^{10}}"), 0.0, "adv_tower"
    if kind == 3:
        return wrap(rng, "{" * 300 + "1" + "}" * 300), 0.0, "adv_nesting"
    if kind == 4:
        return "<think>" + "so 4 " * 20_000 + f"</think> \\boxed{{{truth}}}", 1.0, "adv_100kB"
    if kind == 5:
        return wrap(rng, "(x+1)^{1000}"), 0.0, "adv_slow_sympy"
    if kind == 6:
        return wrap(rng, "99999999!"), 0.0, "adv_factorial"
    return (
        f"<think>hmm</think> The answer contains {truth} somewhere but \\boxed{{{truth}0}}",
        0.0,
        "adv_substring_bait",
    )


def generate(n: int, n_adversarial: int, seed: int = 20240601) -> list[Item]:
    rng = random.Random(seed)
    generators = [g for g, _ in CATEGORIES]
    weights = [w for _, w in CATEGORIES]
    items: list[Item] = []
    samples_per_prompt = 16
    while len(items) < n - n_adversarial:
        make = rng.choices(generators, weights)[0]
        truth, right, wrong = make(rng)
        p_correct = rng.choice([0.1, 0.4, 0.7, 0.9])
        for _ in range(samples_per_prompt):
            correct = rng.random() < p_correct
            answer = rng.choice(right if correct else wrong)
            response = wrap(rng, answer)
            ok = r1_zero_format_ok(response)
            label = 1.0 if correct and ok else 0.0
            items.append(Item(response, truth, label, make.__name__.removeprefix("problem_"), False, ok))
    items = items[: n - n_adversarial]
    for _ in range(n_adversarial):
        response, truth, label, kind = adversarial(rng, str(rng.randint(1, 99)))
        items.insert(
            rng.randrange(len(items) + 1), Item(response, truth, label, kind, True, r1_zero_format_ok(response))
        )
    return items


# --- graders ----------------------------------------------------------------------------------------


def vendor_rule(response: str, truth: str) -> float:
    """Re-implemented from the vendor's description: substring, or last boxed content == truth."""
    start = response.rfind("\\boxed{")
    boxed = None
    if start >= 0:
        depth, i = 0, start + len("\\boxed")
        for j in range(i, len(response)):
            depth += {"{": 1, "}": -1}.get(response[j], 0)
            if depth == 0:
                boxed = response[i + 1 : j]
                break
    return 1.0 if truth in response or boxed == truth else 0.0


def _math_verify_one(args: tuple[str, str]) -> tuple[float, float]:
    from verl.utils.reward_score.math_verify import compute_score

    started = time.perf_counter()
    score = float(compute_score(args[0], args[1]))
    return score, time.perf_counter() - started


def _quiet() -> None:
    logging.disable(logging.WARNING)


def run_math_verify(items: list[Item], workers: int) -> tuple[list[float], float, list[float]]:
    """(scores, wall time, per-item seconds). The same format rule as ours: a response that fails
    it scores 0 without being asked (and costs math-verify nothing)."""
    asked = [i for i, it in enumerate(items) if it.format_ok]
    ctx = multiprocessing.get_context("fork")
    started = time.perf_counter()
    with ctx.Pool(workers, initializer=_quiet) as pool:
        results = pool.map(_math_verify_one, [(items[i].response, items[i].truth) for i in asked], chunksize=32)
    elapsed = time.perf_counter() - started
    scores, seconds = [0.0] * len(items), [0.0] * len(items)
    for i, (score, spent) in zip(asked, results):
        scores[i], seconds[i] = score, spent
    return scores, elapsed, seconds


def run_ours(items: list[Item], workers: int) -> tuple[list, float, float, float]:
    """(grades, cold wall time on all items, warm time on all items, warm time on non-adversarial items)."""
    responses, truths = [it.response for it in items], [it.truth for it in items]
    normal = [i for i, it in enumerate(items) if not it.adversarial]
    clear_caches()
    started = time.perf_counter()
    pool = GuardedPool(PoolConfig(max_workers=workers))
    grades = grade_batch(responses, truths, pool=pool)
    cold = time.perf_counter() - started
    clear_caches()
    started = time.perf_counter()
    grade_batch(responses, truths, pool=pool)
    warm = time.perf_counter() - started
    clear_caches()
    started = time.perf_counter()
    grade_batch([responses[i] for i in normal], [truths[i] for i in normal], pool=pool)
    warm_normal = time.perf_counter() - started
    pool.close()
    return grades, cold, warm, warm_normal


def run_ours_per_call(items: list[Item]) -> float:
    """The NaiveRewardManager path: one compute_score call per response, in order."""
    clear_caches()
    pool = GuardedPool(PoolConfig(max_workers=1))
    pool.warm_up(1)
    started = time.perf_counter()
    for it in items:
        grade(it.response, it.truth, pool=pool)
    elapsed = time.perf_counter() - started
    pool.close()
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8192, help="responses (default: 512 prompts x 16 samples)")
    parser.add_argument("--adversarial", type=int, default=40, help="adversarial responses among them")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes for each grader")
    args = parser.parse_args()
    logging.disable(logging.WARNING)

    items = generate(args.n, args.adversarial)
    normal = [i for i, it in enumerate(items) if not it.adversarial]
    print(
        f"items: {len(items)} ({len(normal)} non-adversarial, {len(items) - len(normal)} adversarial), "
        f"workers per grader: {args.workers}"
    )

    grades, ours_cold, ours_warm, ours_normal = run_ours(items, args.workers)
    ours = [g.score for g in grades]
    mv_normal_scores, mv_normal, _ = run_math_verify([items[i] for i in normal], args.workers)
    adv = [i for i, it in enumerate(items) if it.adversarial]
    mv_adv_scores, mv_adv, _ = run_math_verify([items[i] for i in adv], args.workers)
    mv: list[float] = [0.0] * len(items)
    for i, score in zip(normal, mv_normal_scores):
        mv[i] = score
    for i, score in zip(adv, mv_adv_scores):
        mv[i] = score
    mv_time = mv_normal + mv_adv
    per_call = run_ours_per_call(items)
    vendor = [vendor_rule(it.response, it.truth) for it in items]

    # Format cases are left out of the agreement figure: both graders score them 0 by the same rule.
    graded = [i for i in normal if items[i].format_ok]
    format_cases = [i for i in normal if not items[i].format_ok]
    agree = sum(ours[i] == mv[i] for i in graded) / len(graded)
    disagreements = Counter((items[i].category, ours[i], mv[i]) for i in graded if ours[i] != mv[i])

    def accuracy(scores: list[float], idx: list[int]) -> float:
        return sum(scores[i] == items[i].label for i in idx) / len(idx)

    def false_positive_rate(scores: list[float]) -> float:
        wrong = [i for i in normal if items[i].label == 0.0]
        return sum(scores[i] == 1.0 for i in wrong) / len(wrong)

    print("\n-- wall time (same responses, same number of processes) --")
    print(f"ours, batch, all items, cold (workers started inside the timing): {ours_cold:8.2f} s")
    print(f"ours, batch, all items, warm (a later training step):              {ours_warm:8.2f} s")
    print(f"ours, batch, non-adversarial items only, warm:                     {ours_normal:8.2f} s")
    print(f"ours, one compute_score call per response (NaiveRewardManager):   {per_call:8.2f} s")
    print(
        f"math-verify (verl's integration), process pool, all items:         {mv_time:8.2f} s "
        f"(non-adversarial {mv_normal:.2f} s + adversarial {mv_adv:.2f} s, mostly its own 5 s timeouts)"
    )
    print(
        f"time ratio ours/math-verify: all items (ours cold) {ours_cold / mv_time:.3f}, "
        f"non-adversarial items (ours warm) {ours_normal / mv_normal:.3f}"
    )

    print("\n-- agreement and accuracy --")
    print(
        f"format rule (R1-Zero): {len(format_cases)} non-adversarial responses fail it; ours scores "
        f"{sum(ours[i] == 0.0 for i in format_cases)} of them 0 (math-verify is not asked about them)"
    )
    print(
        f"agreement with math-verify, non-adversarial, format rule passed: {100 * agree:.2f} % "
        f"({sum(disagreements.values())} of {len(graded)} differ)"
    )
    for (category, o, m), count in disagreements.most_common(12):
        print(f"   {count:5d} x {category:<12} ours={o:.0f} math-verify={m:.0f}")
    print(
        f"accuracy vs generator labels, non-adversarial: ours {100 * accuracy(ours, normal):.2f} %, "
        f"math-verify {100 * accuracy(mv, normal):.2f} %, vendor rule {100 * accuracy(vendor, normal):.2f} %"
    )
    print(
        f"accuracy vs labels, adversarial: ours {100 * accuracy(ours, adv):.1f} %, "
        f"math-verify {100 * accuracy(mv, adv):.1f} %, "
        f"vendor rule {100 * accuracy(vendor, adv):.1f} %"
    )
    print(
        f"false-positive rate on wrong answers: vendor rule {100 * false_positive_rate(vendor):.2f} %, "
        f"ours {100 * false_positive_rate(ours):.2f} %, math-verify {100 * false_positive_rate(mv):.2f} %"
    )
    kinds = sorted({items[i].category for i in adv})
    print("adversarial and reward-hack items by kind (right / total): ours, math-verify, vendor rule")
    for kind in kinds:
        idx = [i for i in adv if items[i].category == kind]
        right = [sum(scores[i] == items[i].label for i in idx) for scores in (ours, mv, vendor)]
        print(f"   {kind:<24} {right[0]:3d} {right[1]:3d} {right[2]:3d}  / {len(idx)}")
    reasons = Counter(g.reason.value for g in grades)
    print("our outcomes: " + ", ".join(f"{k}={v}" for k, v in sorted(reasons.items())))

    ok_agree = agree >= 0.99
    ok_time = ours_cold <= TIME_RATIO_GOAL * mv_time
    print(f"\n{'PASS' if ok_agree else 'FAIL'}: agreement with math-verify {100 * agree:.2f} % (goal >= 99 %)")
    print(
        f"{'PASS' if ok_time else 'FAIL'}: our cold wall time over all items {ours_cold:.2f} s = "
        f"{ours_cold / mv_time:.3f} x math-verify's {mv_time:.2f} s (goal <= {TIME_RATIO_GOAL} x)"
    )
    return 0 if ok_agree and ok_time else 1


if __name__ == "__main__":
    sys.exit(main())
