"""The adaptive DDTree budget: each step's tree size chosen from how many requests share the step.

A bigger tree commits more tokens per step but costs more to verify, and the verify cost grows with the
tokens of every running request together: at batch 1 a 64-node tree is almost free, at 32 requests it
competes for the same FLOPs. Budget 0 is "no drafting": an AR step (the target alone, one token per request;
its features wait for the drafter's next pass, which takes them in first, so drafting resumes exactly). The
policy keeps:

- cost: seconds of one whole step (draft, tree, verify, accept, commit) per budget, running count and
  attention window, measured at start-up on the engine's own step runner, with dead rows
  (`StepRunner.dead_step`: the same kernels, or CUDA graphs, as a real step, committing nothing; its rows
  start from distinct random roots, so that an MoE target's verify reaches about as many experts as real rows'
  does, `benchmarks/dead_step_moe.py`), every shape once per pass so that a change of load hits all budgets
  alike; counts and windows in between are interpolated (a step's attention reads its whole window: real steps
  deep into their requests cost more than steps at the smallest window; each budget's step is read at the window
  it reads, its verify's or its drafter's, the larger: a 64-node tree crosses into the next window 48 slots
  before a 16-token block does);
- acceptance, for every budget at once: each drafting step's own tree predicts, for every prefix budget, the
  tokens a request would commit (1 + the summed path probabilities of its nodes,
  `tree.expected_accept_lengths`); the policy keeps a running mean of that prediction per budget, and
  calibrates each budget by what its own tree would have committed beyond the next smaller budget's tree over
  what it predicted beyond it, on the predicting steps whose tree held it (a difference within one step, free of
  the text's difficulty): a smaller budget's tree is the best-scored prefix of the tree run, so a step tells
  what every smaller budget would have accepted (`tree.realised_accept_lengths`), and while a smaller budget
  is chosen one predicting step in ACCEPT_EXPLORE_EVERY runs the largest, at most, and no more often than costs
  about a fiftieth of the throughput, as a far exploring step below (the draft's probabilities misjudge
  small and large trees differently: one factor, learnt at the budget run, kept tiny-code at budget 32 on an
  H100 where 64 committed 17% more tokens for 7% more time); a budget not yet calibrated so takes one factor,
  the ratio of realised to predicted accepted draft tokens over the drafting steps run;

and picks, for r running requests, the budget b that maximises r * accept(b) / cost(r, b, w_b), where w_b is b's
window and cost is the start-up cost under the machine's load at the time, plus an iteration's overhead (the time from a
step's end to the next one's start: a server delivering every request's tokens, the host's bookkeeping; it
weighs most on the shortest steps), AR steps' rate raised by DRAFT_MARGIN (a drafting budget's estimate leans high
where AR steps run). The load is common to every budget, so budgets whose steps ran at
different moments are still compared as if side by side; how it is learnt differs by device:

- on a CPU, a factor on every step (the cores are shared with other processes: it swings by 1.5x within a
  minute), the median over the last steps of each one's measured time over its corrected start-up cost; and a
  budget's correction, the median over its recent steps of what they took, the load taken out, over their
  start-up cost, for each row bucket of the start-up measurement apart (what a real step costs beyond a dead
  one grows with the running requests, so a correction learnt at 64 requests says nothing of one request; a
  budget not yet measured in a bucket takes the median correction of those that were there). The overhead is
  kept per budget and row bucket of the step before it (it grows with what the step committed), the median
  over all steps while one is little measured. Every `explore_every`-th choice measures another budget: the
  best one not yet measured in its row bucket, else, of those the start-up cost alone rates close to the best,
  the one measured longest ago, so no correction goes stale (and a run of AR steps, which predicts nothing, is
  broken by a drafting step now and then). A budget that the start-up cost alone rates far below the budget
  chosen waits, besides, until the steps chosen since the last exploring one add up to 1 / FAR_EXPLORE_SHARE
  times what its step is estimated to lose against the chosen budget's (its time less the time the chosen
  budget takes to commit as many tokens), so that exploring it costs about a fiftieth of the throughput: on
  Qwen3-8B's shape with random weights at 64 requests (H200), a step at budget 1 cost 5.6 AR steps and at
  budget 64 23, and exploring every budget in turn every twentieth step left auto at 0.79x AR's throughput. Those the start-up
  cost rates near the chosen one keep the plain cadence: bounding them too kept auto on a CPU in runs of AR
  steps where drafting paid. While AR steps are chosen, though, exploring slows by half (both the cadence and
  the time waited for) after each exploring step that finds its budget no faster than its correction says, down
  to a quarter (MAX_EXPLORE_BACKOFF), and is back to its plain rate after one that finds it faster.
- on a GPU (`load_adds`), seconds added to every step whatever its budget (the host work of another thread, a
  server's delivery, which the interpreter lock makes the step wait for: a factor would make a small tree's
  step look far cheaper than it is while those waits dominate), and no correction per budget: the start-up
  cost runs the steps' own CUDA graphs and gets the differences between budgets right, while the waits swing
  from step to step (see `BudgetPolicy.load`). The load and the overhead are means over the recent steps of
  every budget, in the overhead's case of the row bucket. No budget's cost needs measuring apart, so the only
  exploring steps are drafting ones that break a run of AR steps, every `explore_every`-th, as above, but
  those the start-up cost rates far below AR wait, as above (a fiftieth of the throughput), and exploring slows
  by half after each one whose committed tokens do not beat AR steps in its estimated time, down to a quarter,
  as above: a drafter that never pays (random weights) then explores a quarter as often.

The rankings behind a choice are recomputed every REFRESH_EVERY observed steps, not at each one (at each one
they took a tenth of a small model's step on a GPU), and the batch engine folds a step's observation in while
the next step runs, and ranks the windows that next step reads; a choice at windows not yet ranked reads its running
count's latest ranking rather than make one.
"""

from __future__ import annotations

import bisect
import math
import statistics
import time
from collections import defaultdict, deque
from typing import TYPE_CHECKING

import torch

from specdeploy.errors import SpecdeployError

if TYPE_CHECKING:
    from specdeploy.engine.step import StepRunner

MIN_SAMPLES = 3  # steps before the calibration, or a budget's measured cost, is trusted
EWMA = 0.05  # weight of a new step in the running means of acceptance (a plain mean over the first 1/EWMA)
COST_WINDOW = 32  # recent steps per budget whose corrections are kept (median: robust to the few steps that
# include compiling or capturing a new CUDA graph, and to a GPU server's host waits, which make single steps noisy)
# recent steps the load is the median over: a quarter of a budget's window, so that the steps a load change
# takes to show leave a budget's median correction unmoved
LOAD_WINDOW = 8
WINDOW_SPACING = 4  # start-up costs are measured at attention windows this factor apart, and at the largest
EXPLORE_WITHIN = 0.75  # exploring steps measure budgets rated >= this share of the best by the start-up cost
# the share of the chosen steps' time that exploring budgets the start-up cost rates far below the chosen one may
# lose (`_exploring_loss`): where they do not pay, that time is lost, on a GPU (random weights, drafting steps
# breaking runs of AR steps) as on a CPU (tiny-code at 8 requests, where AR wins)
FAR_EXPLORE_SHARE = 0.02
# while a smaller budget is chosen, one predicting step in this many runs the largest: such a step tells what every
# budget's own tree would have committed (`tree.realised_accept_lengths`), so each budget's calibration stays
# fresh; about one step in 49 (predictions come every 16th step, `step.PREDICT_EVERY`)
ACCEPT_EXPLORE_EVERY = 4
# a drafting budget is chosen over AR steps only when its estimated tokens/s beat theirs by this share: where AR steps
# run, its estimate leans high. A drafting step after AR steps starts wherever they stopped, while a run at its budget
# starts each step where its last draft failed, in harder text: on a CPU, engines alone at 8 requests, auto's budget-16
# steps, most after AR steps, committed 4.70 tokens a row where DDTree-16's committed 3.64
# (`benchmarks/results/cpu/auto_step_trace_cpu-2026-12-05-85676f7.log`); in a CPU server at 8 requests auto's trees
# rated budget 4 at 2.89 tokens a step, its budget-4 steps committed 3.05 and a DDTree-4 server 2.70, and auto ran
# budget 4 on 37% of its steps at 0.86x the AR server's tok/s (`auto_budget_cpu-2026-12-06-5d9ea48-1round.json`)
DRAFT_MARGIN = 0.08
# while AR steps are chosen, the steps between exploring ones and the time credit they wait for double after each
# exploring step that did not pay (on a CPU: no faster than its correction says; on a GPU: committed no more than
# 1 + DRAFT_MARGIN times the tokens AR steps would have in its time), up to this factor, and are back to 1 after
# one that did: on a CPU a drafting step costs 2.7-5 AR steps, and exploring every 20th step made about 5% of the
# steps drafting ones at 8 requests (tiny-code, `auto_budget_cpu-2026-12-06-0494b23-3rounds.json`); on an H200,
# Qwen3-8B's shape with random weights at 16 requests, exploring drafting steps took about 2% of auto's time
# (`gpu-2026-12-06-h200-head/call-4/`)
MAX_EXPLORE_BACKOFF = 4
# an explored step at this share of its budget's median correction, or less, resets the backoff
EXPLORE_FASTER = 0.8
# a budget's tree predicted less than this beyond the next smaller one's, on the steps that held it: its gain is
# what it added there, unscaled (a ratio of two near-zero means would be noise)
GAIN_FLOOR = 1e-3
REFRESH_EVERY = 4  # observed steps between re-rankings: recomputed at every step, the medians behind a choice
# took a tenth of a small model's step on a GPU (0.07 of 0.7 ms), and four steps move them little


# the attention window (slots) a step reads at each budget, in the order of the policy's `budgets` (a larger tree's
# verify may read a larger one: `StepRunner.step_windows`); None: the smallest the start-up cost measured
Windows = tuple[int, ...] | None


def powers_of_two(limit: int) -> list[int]:
    return [1 << i for i in range(limit.bit_length()) if 1 << i <= limit]


class CostCurve:
    """Seconds as a function of a size, from measurements at a few sizes (linear in between and beyond)."""

    def __init__(self, points: dict[int, float]) -> None:
        self.sizes = sorted(points)
        self.seconds = [points[size] for size in self.sizes]

    def __call__(self, size: int) -> float:
        if len(self.sizes) == 1:
            return self.seconds[0]
        i = bisect.bisect_left(self.sizes, size)
        if i < len(self.sizes) and self.sizes[i] == size:
            return self.seconds[i]
        i = min(max(i, 1), len(self.sizes) - 1)
        (x0, x1), (y0, y1) = self.sizes[i - 1 : i + 1], self.seconds[i - 1 : i + 1]
        return max(0.0, y0 + (y1 - y0) * (size - x0) / (x1 - x0))

    def as_dict(self) -> dict[int, float]:
        return dict(zip(self.sizes, self.seconds, strict=True))


class StepCost:
    """Seconds of one step per budget, as a function of the running rows and the attention window."""

    def __init__(self, by_budget: dict[int, dict[int, CostCurve]]) -> None:
        """`by_budget`: budget -> attention window -> seconds over running rows."""
        self.by_budget = by_budget
        self.rows_measured = next(iter(next(iter(by_budget.values())).values())).sizes
        # (rows, budget, window) -> seconds: steps meet few shapes, and read one every step
        self._seconds: dict[tuple[int, int, int | None], float] = {}

    def __call__(self, rows: int, budget: int, window: int | None = None) -> float:
        """At `window` (default: the smallest measured), linear between the windows measured."""
        key = (rows, budget, window)
        if key not in self._seconds:
            by_window = self.by_budget[budget]
            if window is None or len(by_window) == 1:
                self._seconds[key] = by_window[min(by_window)](rows)
            else:
                self._seconds[key] = CostCurve({w: curve(rows) for w, curve in by_window.items()})(window)
        return self._seconds[key]

    def rows_bucket(self, rows: int) -> int:
        """The smallest running count measured at start-up that holds `rows` (the largest beyond them)."""
        sizes = self.rows_measured
        return sizes[min(bisect.bisect_left(sizes, rows), len(sizes) - 1)]

    def as_dict(self) -> dict[int, dict[int, dict[int, float]]]:
        return {
            budget: {window: curve.as_dict() for window, curve in sorted(by_window.items())}
            for budget, by_window in sorted(self.by_budget.items())
        }


def cost_windows(runner: StepRunner) -> list[int]:
    """The attention windows the start-up cost is measured at: the smallest, WINDOW_SPACING times larger
    ones, and the whole cache's."""
    return runner.windows(WINDOW_SPACING)


@torch.inference_mode()
def measure_step_cost(runner: StepRunner, budgets: list[int], repeats: int = 3) -> StepCost:
    """Median seconds of a dead step per budget at every row bucket the runner uses (or powers of two and
    the largest count, when it does not pad) and every window of `cost_windows`, after one warm-up step
    each (which captures its graphs). Each pass times every shape once, so a load that changes during the
    measurement weighs on every budget alike."""
    rows_measured = (
        runner.row_buckets() if runner.fixed_shapes else sorted({*powers_of_two(runner.rows), runner.rows})
    )
    shapes = [(b, r, w) for b in budgets for r in rows_measured for w in cost_windows(runner)]
    synchronize = torch.cuda.synchronize if runner.device.type == "cuda" else lambda device: None
    for budget, rows, window in shapes:
        runner.dead_step(rows, budget, window)
    times: dict[tuple[int, int, int], list[float]] = {shape: [] for shape in shapes}
    for _ in range(repeats):
        for budget, rows, window in shapes:
            synchronize(runner.device)
            started = time.perf_counter()
            runner.dead_step(rows, budget, window)
            synchronize(runner.device)
            times[budget, rows, window].append(time.perf_counter() - started)
    points: dict[int, dict[int, dict[int, float]]] = {}
    for (budget, rows, window), seconds in times.items():
        points.setdefault(budget, {}).setdefault(window, {})[rows] = statistics.median(seconds)
    return StepCost(
        {b: {w: CostCurve(by_rows) for w, by_rows in by_window.items()} for b, by_window in points.items()}
    )


def robust_mean(values: list[float]) -> float:
    """The mean of `values` without those beyond Tukey's far-out fence (3 interquartile ranges above the
    upper quartile): a step that compiled or captured a graph, not the host's ordinary waits."""
    if len(values) < 4:
        return statistics.fmean(values)
    low, _, high = statistics.quantiles(values, n=4)
    fence = high + 3 * (high - low)
    return statistics.fmean([v for v in values if v <= fence])


def running_mean(mean: float, value: float, count: int) -> float:
    """Fold the `count`-th value in: a plain mean over the first 1/EWMA values, exponential after."""
    weight = max(EWMA, 1 / count)
    return (1 - weight) * mean + weight * value


class BudgetPolicy:
    def __init__(
        self,
        budgets: list[int],
        cost: StepCost | None = None,
        explore_every: int = 20,
        load_adds: bool | None = None,
    ) -> None:
        """`budgets`: the choices, 0 (an AR step) among them or not; `cost`: the start-up step cost, None until
        the batch engine measures it on its runner; `load_adds`: the load is seconds added to every step (a
        GPU's host waits) rather than a factor on its time (a CPU's cores shared with other processes); None:
        as the batch engine's device says."""
        if not budgets or min(budgets) < 0:
            raise SpecdeployError(f"budgets must be at least 0 (0: an AR step), got {budgets}")
        self.budgets = sorted(set(budgets))
        # a budget's place in `budgets` and windows
        self._position = {b: i for i, b in enumerate(self.budgets)}
        self.drafting = [b for b in self.budgets if b > 0]
        self.cost = cost
        self.explore_every = explore_every
        self.load_adds = load_adds
        self.predicted = dict.fromkeys(self.drafting, 0.0)  # running mean of the trees' predictions
        self.predictions = 0  # drafting steps whose trees predicted every budget
        # tokens committed per request a step, summed over the steps at each budget (/server_info's mean: a running
        # mean read after a benchmark's cell shows its drain, where rows near their token limit commit little)
        self.realised_total = dict.fromkeys(self.budgets, 0.0)
        # the trees' prediction for a budget on the steps run at it, and how many of those predicted
        self.predicted_at = dict.fromkeys(self.budgets, 0.0)
        self.predicted_samples = dict.fromkeys(self.budgets, 0)
        self.samples = dict.fromkeys(self.budgets, 0)
        # running means over drafting steps of the accepted draft tokens realised and predicted (at the budget run)
        self.realised_drafts, self.predicted_drafts, self.calibration_steps = 0.0, 0.0, 0
        # per drafting budget, running means over the predicting steps whose tree held it (it or a larger one
        # ran) of the draft tokens its own tree would have committed and of those it predicted, their count,
        # and `predictions` at the last of them
        self.budget_realised = dict.fromkeys(self.drafting, 0.0)
        self.budget_predicted = dict.fromkeys(self.drafting, 0.0)
        self.budget_calibrations = dict.fromkeys(self.drafting, 0)
        self.calibrated_at = dict.fromkeys(self.drafting, 0)
        # per drafting budget, over the same steps: running means of what its tree would have committed beyond
        # the next smaller drafting budget's tree (the smallest: beyond the bonus token), and of what it predicted
        # beyond it; each step's pair of trees is one tree and its prefix, so the difference is free of the text's
        # difficulty, which moves both alike (`estimate`)
        self.gain_realised = dict.fromkeys(self.drafting, 0.0)
        self.gain_predicted = dict.fromkeys(self.drafting, 0.0)
        # `estimate` of every drafting budget, until the next predicting step is folded in
        self._estimates: dict[int, float] | None = None
        # the step chosen last is to predict: it explores acceptance (the engine reads it)
        self.predict_next = False
        self._largest = self.drafting[-1] if self.drafting else 0
        # whether steps have told what smaller trees would have committed: only then is acceptance explored (a
        # policy fed by hand may never be told)
        self._told_smaller = False
        self._acceptance_explored_at = -ACCEPT_EXPLORE_EVERY  # `predictions` at the last such step
        self._accept_credit = 0.0  # estimated seconds of the drafting steps chosen since (`_accept_loss`)
        self._accept_loss_cache: dict[tuple[int, int, Windows], float] = {}
        self.choices = 0
        self._explore_credit = 0.0  # estimated seconds of the steps chosen since the last exploring one
        self._since_explored = 0  # choices since the last exploring one
        # the factor on `explore_every` and on the time credit while AR steps are chosen, and the (budget, row
        # bucket) of an exploring step chosen beside AR steps and not yet observed (MAX_EXPLORE_BACKOFF)
        self._explore_backoff = 1
        self._explored_beside_ar: tuple[int, int] | None = None
        # ((running, windows), budget, the time credit it waits for) of the next exploring step, until a refresh
        self._exploring: tuple[tuple[int, int | None], int, float] | None = None
        self.last_choice: dict[int, int] = {}  # running requests -> the budget chosen last time
        # per (budget, row bucket): its recent steps' measured over predicted time, the load at their time taken out
        self.cost_ratios: dict[tuple[int, int], deque[float]] = defaultdict(lambda: deque(maxlen=COST_WINDOW))
        # (budget, row bucket, measured seconds, start-up seconds) of the last steps
        self.recent: deque[tuple[int, int, float, float]] = deque(maxlen=COST_WINDOW)
        # per (budget, row bucket): seconds between one such step's end and the next step's start (delivering
        # its tokens), and of all those steps together
        self.overheads_by: dict[tuple[int, int], deque[float]] = defaultdict(
            lambda: deque(maxlen=COST_WINDOW)
        )
        self.overheads: deque[float] = deque(maxlen=COST_WINDOW)
        # per row bucket, those after any budget's steps (what `load_adds` reads: one deque, not every budget's)
        self.overheads_in: dict[int, deque[float]] = defaultdict(lambda: deque(maxlen=COST_WINDOW))
        self._last_step: tuple[int, int] | None = None  # (budget, row bucket) of the last observed step
        self.measured_at: dict[tuple[int, int], int] = {}  # (budget, row bucket) -> its last timed step
        self.steps_observed = 0
        self._corrections_cache: dict[int, dict[int, float]] = {}  # row bucket -> budget -> correction
        self._load_cache: float | None = None  # load(), until the next refresh
        self._ranking_cache: dict[tuple[int, Windows], list[int]] = {}  # (running, windows) -> ranking
        # running -> the ranking made last for that count since the refresh, at whatever windows
        self._latest_ranking: dict[int, list[int]] = {}
        # (running, budget, the window its step reads) -> its rate in `ranking`
        self._rate_cache: dict[tuple[int, int, int | None], float] = {}
        # rankings made by `choose` itself (none had been made for its running count), and in all; choices that
        # took the count's latest ranking, made at other windows
        self.rankings_at_choice, self.rankings, self.choices_at_earlier_windows = 0, 0, 0
        self._seconds_cache: dict[tuple[int, int, Windows], float] = {}  # (running, budget, windows) -> s
        self._overhead_cache: dict[
            tuple[int | None, int | None], float
        ] = {}  # (budget, bucket) -> overhead()
        self._since_refresh = 0  # steps observed since the caches above were last cleared

    def calibration(self, budget: int | None = None) -> float:
        """Realised over predicted accepted draft tokens. For `budget`, once MIN_SAMPLES predicting steps held
        its tree: `estimate`'s draft tokens over the trees' mean prediction (the draft's probabilities misjudge
        small and large trees differently: tiny-code on an H100 realised 0.95 of the prediction at budget 32 and
        1.09 at 64). Else, and for no budget, over the drafting steps run, at whatever budget each ran (1 until
        a few are)."""
        if budget in self.budget_calibrations and self.budget_calibrations[budget] >= MIN_SAMPLES:
            if self.predicted[budget] > 1:
                return (self.estimate(budget) - 1) / (self.predicted[budget] - 1)
        if self.calibration_steps < MIN_SAMPLES or self.predicted_drafts <= 0:
            return 1.0
        return self.realised_drafts / self.predicted_drafts

    def estimate(self, budget: int) -> float:
        """Expected tokens per request per step at `budget`: 1 for an AR step; else, from the smallest drafting
        budget up, what each budget's tree is predicted to add beyond the next smaller one's (the trees' running
        mean), scaled by what it added over what it predicted on the predicting steps that held it
        (`gain_realised`); while fewer than MIN_SAMPLES did, the trees' prediction scaled by the one factor of
        `calibration()`. Each gain is a difference within one step's tree, so a budget told by few steps, the
        largest, is not rated by the text those few happened to meet: averaged over its own steps instead, what
        budget 64's trees (run one predicting step in four) would have committed came out at 4.00 tokens in a
        server on an H200 at one request, and budget 32's at 4.54, although a tree never commits less than its
        prefix (`tests/test_budget_calibration.py` simulates it).
        Before MIN_SAMPLES drafting steps, budget + 1: every budget is as good as it could be, which makes the
        first steps draft and so predict; one tree alone, say a request's first, can predict so little that AR
        steps, which predict nothing, would follow until an exploring step."""
        if budget == 0:
            return 1.0
        if self.predictions < MIN_SAMPLES:
            return float(budget + 1)
        if self._estimates is None:
            self._estimates = self._chained_estimates()
        return self._estimates[budget]

    def _chained_estimates(self) -> dict[int, float]:
        """`estimate` of every drafting budget: each calibrated one the one below it plus its calibrated gain (the
        calibrated budgets are the smallest ones: a step that holds a tree holds every smaller one); each other
        one its trees' prediction scaled by the one factor."""
        one_factor = self.calibration()
        estimates, total, below = {}, 1.0, 1.0  # the estimate so far, and the prediction of the tree below
        for budget in self.drafting:
            more = self.predicted[budget] - below
            if self.budget_calibrations[budget] < MIN_SAMPLES:
                estimates[budget] = 1 + one_factor * (self.predicted[budget] - 1)
                continue
            if self.gain_predicted[budget] > GAIN_FLOOR:
                total += self.gain_realised[budget] * more / self.gain_predicted[budget]
            else:  # its tree predicted nothing beyond the smaller one's: what it added, as it was
                total += self.gain_realised[budget]
            estimates[budget], below = total, self.predicted[budget]
        return estimates

    def step_seconds(self, running: int, budget: int, windows: Windows = None) -> float:
        """Seconds of one step by the start-up cost, at the attention window a step at `budget` reads."""
        return self.cost(running, budget, None if windows is None else windows[self._position[budget]])

    def cost_ratio(self, budget: int, bucket: int) -> float:
        """The correction of `budget`'s start-up cost at running counts of row bucket `bucket`, relative to the
        load (the other budgets' there while it is little measured)."""
        return self._corrections(bucket)[budget]

    def _corrections(self, bucket: int) -> dict[int, float]:
        """`cost_ratio` of every budget in `bucket`, computed once per refresh (choose reads them every step);
        1 for every budget with `load_adds`, which trusts the start-up cost's differences (see `load`)."""
        if bucket not in self._corrections_cache:
            if self.load_adds:
                self._corrections_cache[bucket] = dict.fromkeys(self.budgets, 1.0)
            else:
                measured = {b: self.cost_ratios.get((b, bucket), ()) for b in self.budgets}
                own = {b: statistics.median(r) for b, r in measured.items() if len(r) >= MIN_SAMPLES}
                fallback = statistics.median(own.values()) if own else 1.0
                self._corrections_cache[bucket] = {b: own.get(b, fallback) for b in self.budgets}
        return self._corrections_cache[bucket]

    def load(self) -> float | None:
        """What the last steps took beyond their start-up time (None before any step).

        On a CPU, a factor: the median over the last LOAD_WINDOW steps of each one's measured time over its
        start-up time times its budget's correction. On a GPU (`load_adds`), seconds added to every step
        whatever its budget: the mean (`robust_mean`) over the last COST_WINDOW steps of each one's measured
        less its start-up time. There the start-up cost runs the steps' own CUDA graphs and gets the
        differences between budgets right (within 0.03 ms of real steps, tiny-code on an H200), while what
        real steps add (host waits: another thread holding the interpreter, a server's delivery) swings from
        step to step, heavy-tailed. Per-budget corrections then measured the swings, not the budgets: each
        budget's median over its few steps, taken at other moments than the chosen one's, made budget 8 look
        1.25x better than 64 in a server at 16 requests, where 64 won by 1.2x. And a mean, not a median: a
        step's expected time is what the throughput pays, and the median of a heavy tail understates it."""
        if not self.recent:
            return None
        if self._load_cache is None:
            if self.load_adds:
                self._load_cache = robust_mean(
                    [seconds - predicted for _, _, seconds, predicted in self.recent]
                )
            else:
                recent = list(self.recent)[-LOAD_WINDOW:]
                self._load_cache = statistics.median(
                    seconds / (predicted * self.cost_ratio(b, bucket))
                    for b, bucket, seconds, predicted in recent
                )
        return self._load_cache

    def current_load(self) -> float:
        """`load`, or no load (0 s added, or a factor of 1) before any step."""
        load = self.load()
        return load if load is not None else (0.0 if self.load_adds else 1.0)

    def loaded(self, seconds: float, correction: float, load: float) -> float:
        """A step's time by the start-up cost (`seconds`) with its budget's correction, under `load`."""
        return seconds * correction + load if self.load_adds else seconds * correction * load

    def overhead(self, budget: int | None = None, bucket: int | None = None) -> float:
        """Seconds an iteration spends outside its step (and any prefill) after a step at `budget` of row bucket
        `bucket` (a server delivers its tokens then): the median of the last measured after such steps, or after
        any step while fewer than MIN_SAMPLES were (0 before any). With `load_adds`, as for `load`, the mean
        (`robust_mean`) of the last measured after any budget's steps in the bucket."""
        key = (None if self.load_adds else budget, bucket)  # with load_adds every budget shares it
        if key not in self._overhead_cache:
            own = list(
                self.overheads_in.get(bucket, ()) if self.load_adds else self.overheads_by.get(key, ())
            )
            if len(own) < MIN_SAMPLES:
                own = list(self.overheads)
            average = robust_mean if self.load_adds else statistics.median
            self._overhead_cache[key] = average(own) if own else 0.0
        return self._overhead_cache[key]

    def observe_overhead(self, seconds: float) -> None:
        """Fold in the time from the last observed step's end to the next one's start, less the prefill in
        between."""
        seconds = max(0.0, seconds)
        self.overheads.append(seconds)
        if self._last_step is not None:
            self.overheads_by[self._last_step].append(seconds)
            self.overheads_in[self._last_step[1]].append(seconds)

    def throughput(
        self,
        running: int,
        budget: int,
        windows: Windows = None,
        load: float | None = None,
        overhead: float | None = None,
        corrected: bool = True,
    ) -> float:
        """Tokens per second at `budget`, its step at the current load plus the overhead of an iteration
        (`load`, `overhead`: when already known; `corrected`: the start-up cost with the budget's correction,
        else as measured at start-up)."""
        seconds = self.iteration_seconds(running, budget, windows, load, overhead, corrected)
        return running * self.estimate(budget) / max(seconds, 1e-9)

    def iteration_seconds(
        self,
        running: int,
        budget: int,
        windows: Windows = None,
        load: float | None = None,
        overhead: float | None = None,
        corrected: bool = True,
    ) -> float:
        """Estimated seconds of an iteration whose step runs `budget`: `throughput`'s denominator."""
        load = load if load is not None else self.current_load()
        bucket = self.cost.rows_bucket(running)
        overhead = overhead if overhead is not None else self.overhead(budget, bucket)
        correction = self.cost_ratio(budget, bucket) if corrected else 1.0
        return self.loaded(self.step_seconds(running, budget, windows), correction, load) + overhead

    def ranking(self, running: int, windows: Windows = None) -> list[int]:
        """The budgets by estimated tokens per second, AR's raised by DRAFT_MARGIN, best first (kept until the
        next refresh)."""
        key = (running, windows)
        ranked = self._ranking_cache.get(key)
        if ranked is None:
            self.rankings += 1
            rate = {b: self._rate(running, b, windows) for b in self.budgets}
            ranked = self._ranking_cache[key] = sorted(self.budgets, key=rate.__getitem__, reverse=True)
            self._latest_ranking[running] = ranked
        return ranked

    def _rate(self, running: int, budget: int, windows: Windows) -> float:
        """`ranking`'s rate of `budget`, kept until the next refresh by the window its step reads: when one
        budget's tree crosses into the next window, a ranking recomputes that budget's alone."""
        key = (running, budget, None if windows is None else windows[self._position[budget]])
        rate = self._rate_cache.get(key)
        if rate is None:
            bucket = self.cost.rows_bucket(running)
            rate = self.throughput(
                running, budget, windows, self.current_load(), self.overhead(budget, bucket)
            )
            if budget == 0:
                rate *= 1 + DRAFT_MARGIN
            self._rate_cache[key] = rate
        return rate

    def choose(self, running: int, windows: Windows = None) -> int:
        """The budget for a step of `running` requests, each budget's step reading its attention window in
        `windows`. Without a ranking for them since the last refresh, one made since then for `running` at other
        windows, an earlier step's: the batch engine ranks the windows of each step while it runs, so the next
        choice finds its own ranked unless a row's tree crossed into another window, and a choice that made the
        ranking would delay its step (0.017 ms of a 0.53 ms iteration on an H100, one choice in ten waiting)."""
        ranked = self._ranking_cache.get((running, windows))
        if ranked is None:
            ranked = self._latest_ranking.get(running)
            if ranked is None:
                ranked = self.ranking(running, windows)
                self.rankings_at_choice += 1
            else:
                self.choices_at_earlier_windows += 1
        self.choices += 1
        choice = ranked[0]
        # with `load_adds` no budget's cost is measured apart: only AR steps, which predict nothing, are broken
        # by drafting ones, so that the trees' predictions stay fresh
        if len(ranked) > 1 and not (self.load_adds and choice > 0):
            self._since_explored += 1
            self._explore_credit += self._chosen_seconds(running, choice, windows) * FAR_EXPLORE_SHARE
            beside_ar = choice == 0  # where the backoff applies
            backoff = self._explore_backoff if beside_ar else 1
            if self._since_explored >= self.explore_every * backoff:
                if self._exploring is None or self._exploring[0] != (running, windows):
                    explored, near = self._explored(running, windows, ranked)
                    seconds = 0.0 if near else self._exploring_loss(running, explored, choice, windows)
                    self._exploring = ((running, windows), explored, seconds)
                _, explored, seconds = self._exploring
                if self._explore_credit >= seconds * backoff:
                    if beside_ar:
                        self._explored_beside_ar = (explored, self.cost.rows_bucket(running))
                    choice = explored
                    self._explore_credit, self._since_explored, self._exploring = 0.0, 0, None
        self.last_choice[running] = choice
        largest = self._largest
        if self._told_smaller and 0 < choice < largest:
            self._accept_credit += self._chosen_seconds(running, choice, windows) * FAR_EXPLORE_SHARE
            if self._acceptance_stale(largest) and self._accept_credit >= self._accept_loss(
                running, choice, windows
            ):
                choice, self.predict_next = largest, True
                self._acceptance_explored_at, self._accept_credit = self.predictions, 0.0
        return choice

    def _accept_loss(self, running: int, chosen: int, windows: Windows) -> float:
        """`_exploring_loss` of a step at the largest budget instead of `chosen`, kept until the next refresh:
        an acceptance-exploring step waits, as a far exploring one does, until the steps chosen since the last
        add up to 1 / FAR_EXPLORE_SHARE times it (at one request on a GPU a 64-node step loses almost nothing
        against a 32-node one; at 8 requests on a CPU a 16-node step costs several times a 4-node one)."""
        key = (running, chosen, windows)
        if key not in self._accept_loss_cache:
            self._accept_loss_cache[key] = self._exploring_loss(running, self._largest, chosen, windows)
        return self._accept_loss_cache[key]

    def _acceptance_stale(self, budget: int) -> bool:
        """Whether `budget`'s calibration waits for a predicting step that holds its tree: it has fewer than
        MIN_SAMPLES, or none among the last ACCEPT_EXPLORE_EVERY - 1 predicting steps; at most once every
        ACCEPT_EXPLORE_EVERY predicting steps."""
        if self.predictions - self._acceptance_explored_at < ACCEPT_EXPLORE_EVERY:
            return False
        count, since = self.budget_calibrations[budget], self.predictions - self.calibrated_at[budget]
        return count < MIN_SAMPLES or since >= ACCEPT_EXPLORE_EVERY - 1

    def _back_off_exploring(self, paid: bool | None) -> None:
        """After an exploring step beside AR steps: double the backoff (up to MAX_EXPLORE_BACKOFF) if it did not
        pay, reset it if it did (drafting may pay again: the way back to it keeps the plain cadence); None
        (nothing to judge it by yet) leaves it as it is."""
        self._explored_beside_ar = None
        if paid is not None:
            self._explore_backoff = 1 if paid else min(2 * self._explore_backoff, MAX_EXPLORE_BACKOFF)

    def _faster_than_its_correction(self, budget: int, bucket: int, correction: float) -> bool | None:
        """On a CPU, where exploring measures costs: whether a step that measured `correction` was faster than
        its budget's median correction says (by EXPLORE_FASTER); None while fewer than MIN_SAMPLES are kept."""
        measured = self.cost_ratios.get((budget, bucket), ())
        if len(measured) < MIN_SAMPLES:
            return None
        return correction <= EXPLORE_FASTER * statistics.median(measured)

    def _beat_ar(self, running: int, budget: int, realised: float, windows: Windows) -> bool:
        """On a GPU (`load_adds`), where exploring beside AR steps only tells acceptance: whether a step at
        `budget` that committed `realised` tokens a request beat AR steps by DRAFT_MARGIN, both at their
        estimated iteration times (a single step's measured time swings with the host's waits)."""
        drafting = self.iteration_seconds(running, budget, windows)
        return realised * self.iteration_seconds(running, 0, windows) > (1 + DRAFT_MARGIN) * drafting

    def _exploring_loss(self, running: int, explored: int, chosen: int, windows: Windows) -> float:
        """Seconds an iteration at `explored` is estimated to lose against one at `chosen`: its time less the
        time `chosen` takes to commit as many tokens (an AR step explored beside a slow drafting budget loses
        little; a large tree explored beside AR steps at many requests loses most of its time)."""
        seconds = self.iteration_seconds(running, explored, windows)
        chosen_seconds = self._chosen_seconds(running, chosen, windows)
        return max(0.0, seconds - chosen_seconds * self.estimate(explored) / self.estimate(chosen))

    def _chosen_seconds(self, running: int, budget: int, windows: Windows) -> float:
        """`iteration_seconds` of a chosen budget, kept until the next refresh (choose reads it every step)."""
        key = (running, budget, windows)
        if key not in self._seconds_cache:
            self._seconds_cache[key] = self.iteration_seconds(running, budget, windows)
        return self._seconds_cache[key]

    def _explored(self, running: int, windows: Windows, ranked: list[int]) -> tuple[int, bool]:
        """The budget an exploring step measures: the best one whose cost in this row bucket is not yet
        measured; once all are, of the others that the start-up cost alone (no correction) rates within
        EXPLORE_WITHIN of the best of them, the one measured there longest ago. A correction is only as fresh
        as its budget's last steps: one learnt in a burst of host work would otherwise keep its budget
        unmeasured, and so unchosen, for good. Also whether the start-up cost alone rates it within
        EXPLORE_WITHIN of the budget chosen (`ranked[0]`)."""
        bucket = self.cost.rows_bucket(running)
        load, overhead = self.current_load(), self.overhead()
        prior = {b: self.throughput(running, b, windows, load, overhead, corrected=False) for b in ranked}
        unmeasured = [b for b in ranked[1:] if len(self.cost_ratios.get((b, bucket), ())) < MIN_SAMPLES]
        if unmeasured:
            explored = unmeasured[0]
        else:
            best = max(prior[b] for b in ranked[1:])
            candidates = [b for b in ranked[1:] if prior[b] >= EXPLORE_WITHIN * best]
            explored = min(candidates, key=lambda b: self.measured_at.get((b, bucket), -1))
        return explored, prior[explored] >= EXPLORE_WITHIN * prior[ranked[0]]

    def observe(
        self,
        budget: int,
        accept_lengths: list[int],
        seconds: float | None = None,
        expected: list[list[float]] | None = None,
        windows: Windows = None,
        realised_by_budget: list[list[float]] | None = None,
    ) -> None:
        """Fold in one step at `budget`: the tokens each running request committed, the step's measured time
        (`seconds`, when known, its attention window in `windows`) and, for a predicting step, each request's
        tree prediction at every drafting budget (`expected`, rows in the order of `drafting`) and the tokens it
        would have committed at each (`realised_by_budget`, the same shape, NaN for budgets above the step's tree)."""
        if seconds is not None:
            step_seconds = self.step_seconds(len(accept_lengths), budget, windows)
            if step_seconds > 0:
                load = self.load()
                bucket = self.cost.rows_bucket(len(accept_lengths))
                if load is None:  # the first step sets the load: its budget's correction stays as it is
                    correction = self.cost_ratio(budget, bucket)
                elif self.load_adds:  # what the step took beyond the load, over its start-up time
                    correction = max(seconds - load, 0.0) / step_seconds
                else:
                    correction = seconds / step_seconds / load
                if self._explored_beside_ar == (budget, bucket) and not self.load_adds:
                    self._back_off_exploring(self._faster_than_its_correction(budget, bucket, correction))
                self.cost_ratios[budget, bucket].append(correction)
                self.recent.append((budget, bucket, seconds, step_seconds))
                self._last_step = (budget, bucket)
                self.measured_at[budget, bucket] = self.steps_observed
        self.steps_observed += 1
        self._since_refresh += 1
        if self._since_refresh >= REFRESH_EVERY:
            self.refresh()
        self.samples[budget] += 1
        realised = sum(accept_lengths) / len(accept_lengths)
        self.realised_total[budget] += realised
        running, explored = len(accept_lengths), self._explored_beside_ar
        if self.load_adds and explored is not None and explored == (budget, self.cost.rows_bucket(running)):
            self._back_off_exploring(self._beat_ar(running, budget, realised, windows))
        if expected is None:
            return
        self.predictions += 1
        means = [sum(column) / len(column) for column in zip(*expected, strict=True)]
        for b, mean in zip(self.drafting, means, strict=True):
            self.predicted[b] = running_mean(self.predicted[b], mean, self.predictions)
        if budget > 0:
            predicted = means[self.drafting.index(budget)]
            self.predicted_samples[budget] += 1
            self.predicted_at[budget] = running_mean(
                self.predicted_at[budget], predicted, self.predicted_samples[budget]
            )
            self.calibration_steps += 1
            count = self.calibration_steps
            self.realised_drafts = running_mean(self.realised_drafts, realised - 1, count)
            self.predicted_drafts = running_mean(self.predicted_drafts, predicted - 1, count)
        if realised_by_budget is not None:
            self._calibrate_budgets(realised_by_budget, means)
        self._estimates = None

    def _calibrate_budgets(self, realised: list[list[float]], predicted: list[float]) -> None:
        """Fold one predicting step's rows (what each budget's tree would have committed, and the mean over the
        rows of what each predicted) into each budget its tree held (`budget_realised`, `gain_realised`)."""
        self._told_smaller = True
        below_realised, below_predicted = 1.0, 1.0  # the next smaller budget's, on this step
        for budget, would, told in zip(self.drafting, zip(*realised, strict=True), predicted, strict=True):
            if math.isnan(would[0]):  # above the step's tree (every row's tree has the step's size)
                break
            would_mean = sum(would) / len(would)
            count = self.budget_calibrations[budget] = self.budget_calibrations[budget] + 1
            self.calibrated_at[budget] = self.predictions
            self.budget_realised[budget] = running_mean(self.budget_realised[budget], would_mean - 1, count)
            self.budget_predicted[budget] = running_mean(self.budget_predicted[budget], told - 1, count)
            self.gain_realised[budget] = running_mean(
                self.gain_realised[budget], would_mean - below_realised, count
            )
            self.gain_predicted[budget] = running_mean(
                self.gain_predicted[budget], told - below_predicted, count
            )
            below_realised, below_predicted = would_mean, told

    def refresh(self) -> None:
        """Recompute the corrections, the load and the rankings from the steps observed so far when next read."""
        self._corrections_cache.clear()
        self._load_cache = None
        self._ranking_cache.clear()
        self._latest_ranking.clear()
        self._rate_cache.clear()
        self._seconds_cache.clear()
        self._overhead_cache.clear()
        self._accept_loss_cache.clear()
        self._exploring = None
        self._since_refresh = 0

    @staticmethod
    def _median_table(
        samples: dict[tuple[int, int], deque[float]], scale: float, digits: int
    ) -> dict[int, dict[int, float]]:
        """Budget -> row bucket -> the median of its samples, times `scale`."""
        table: dict[int, dict[int, float]] = {}
        for (budget, bucket), values in sorted(samples.items()):
            if values:
                table.setdefault(budget, {})[bucket] = round(scale * statistics.median(values), digits)
        return table

    def describe(self) -> dict:
        """What /server_info shows: the cost and acceptance curves, and the latest choice per running count."""
        return {
            "budgets": self.budgets,
            "step_ms_by_budget_window_and_rows": {
                b: {w: {r: round(1e3 * s, 3) for r, s in curve.items()} for w, curve in by_window.items()}
                for b, by_window in self.cost.as_dict().items()
            },
            "predicted_accept_length_by_budget": {b: round(self.estimate(b), 3) for b in self.budgets},
            "tree_predicted_accept_length_by_budget": {
                b: round(self.predicted[b], 3) for b in self.drafting if self.predictions
            },
            # the mean over every step run at the budget, as `steps_by_budget` counts them
            "realised_accept_length_by_budget": {
                b: round(self.realised_total[b] / self.samples[b], 3) for b in self.budgets if self.samples[b]
            },
            "tree_predicted_accept_length_on_steps_run_by_budget": {
                b: round(self.predicted_at[b], 3) for b in self.drafting if self.predicted_samples[b]
            },
            "calibration": round(self.calibration(), 4),
            # per budget, on the predicting steps that held its tree: what that tree would have committed, and
            # the calibration read from it
            "tree_realised_accept_length_by_budget": {
                b: round(1 + self.budget_realised[b], 3) for b in self.drafting if self.budget_calibrations[b]
            },
            "calibration_by_budget": {
                b: round(self.calibration(b), 4)
                for b in self.drafting
                if self.budget_calibrations[b] >= MIN_SAMPLES
            },
            "steps_by_budget": {b: self.samples[b] for b in self.budgets},
            # each budget's measured over start-up step time, the load taken out (applied only without
            # load_adds: on a GPU they are shown, not used)
            "cost_correction_by_budget_and_rows": self._median_table(self.cost_ratios, 1.0, 4),
            "cost_corrections_applied": not self.load_adds,
            "load": round(self.current_load(), 6),
            "load_adds": self.load_adds,
            "overhead_ms": round(1e3 * self.overhead(), 3),
            # ms between a step of that budget and row bucket and the next step
            "overhead_ms_by_budget_and_rows": self._median_table(self.overheads_by, 1e3, 3),
            "chosen_by_running": dict(sorted(self.last_choice.items())),
            # rankings made at a choice (the step waits for them) and in all (the others while a step runs), and
            # the choices that read their running count's ranking made at an earlier step's windows
            "rankings_made_at_choice": self.rankings_at_choice,
            "choices_at_earlier_windows": self.choices_at_earlier_windows,
            "rankings_made": self.rankings,
            "choices": self.choices,
        }
