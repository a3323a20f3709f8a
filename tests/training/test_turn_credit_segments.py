"""Turn credit (`--estimator turn|gigpo`, `--turn-rewards`) on an episode cut into segment rows by
context edits trains exactly as the same episode as one row (`training/segment_credit.episode_credit`).

The oracle is independent of the segment code: the same episodes laid out one row each, as a batch
without a context policy, credited by the turn-credit code that reads one row an episode. Both
layouts are built from one description of each episode, so every sampled token's place in both is
known: in the segmented layout a row's context holds the earlier turns' sampled tokens verbatim
(with their turn ids) but their observations as shorter stubs, so a token's column differs between
the layouts and between the rows that hold it. Shown, for `turn` and `gigpo` with per-turn rewards
off, `retrieval` and `on` (and none given):

- every flat sampled token's advantage is the one the segment row that trains it (its `loss_mask`)
  gives it, each flat token trained by exactly one row, nothing else non-zero;
- the loss of each episode (its rows together) is its one-row loss, and the whole batch's loss and
  gradient per token are the one-row batch's, under token-mean and the sequence means;
- per-turn rewards and the credit metrics are the episode's (its final row), whatever the other
  rows' scores; GRPO on segments stays `segments.episode_advantages`;
- the controls: crediting each row as a sample of its own gives other advantages, and a row whose
  context does not hold the earlier turns verbatim is refused;
- `learn` takes `--estimator turn` with a context policy, and a real one-step run on the tiny
  model's engine trains cut episodes with turn credit.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.training.test_segment_weighting import N  # the same groups: N samples per prompt
from tests.training.test_turn_credit import SCORES, TRUTHS
from vrag_rollout.training.grpo import actor_config, episode_policy_loss, estimator_advantages
from vrag_rollout.training.segments import episode_advantages, last_rows
from vrag_rollout.training.turn_credit import Credit, credit_advantages

# per episode (episode k answers prompt k // N): per turn (its sampled text, its observation's
# tokens, the pages shown after it); the cuts: the turns after which a context edit closed a row
EPISODES = [
    [("<search>annual report</search>", 6, ["doc_2", "doc_1"]), ("<search>annual  Report</search>", 5, ["doc_4"]),
     ("<search>growth</search>", 4, ["doc_2"]), ("<answer>2 4</answer>", 0, [])],
    [("<search>annual report</search>", 6, ["doc_1"]), ("<search></search>", 3, []), ("<answer>2</answer>", 0, [])],
    [("<search>other</search>", 5, ["other_3"]), ("<answer>3</answer>", 0, [])],
    [("<search>other doc</search>", 4, ["other_1"]), ("<search>x</search>", 4, ["other_3", "other_1"]),
     ("<answer>3</answer>", 0, [])],
]
CUTS = [[1, 3], [1, 2], [], [2]]
OBSERVED, STUB = 2000, 3000  # observation token ids; an edited-out observation's stub (2 tokens)
ESTIMATORS = ("turn", "gigpo")
PRESETS = (None, "off", "retrieval", "on")
OUTCOME_ONLY = ("turn", True)  # `turn` on the outcome alone: one value an episode
BOGUS = {"overall": 99.0, "accuracy": 0.0, "f1": 0.0, "format": 0.0, "retrieval": 0.0}


class CharTokenizer:
    """A sampled token is a character; observation and stub tokens decode to nothing."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i < OBSERVED)


def turn_tokens(episode: int, turn: int, edited: bool) -> list:
    """(token id, sampled) of a turn: its text, then its observation (a 2-token stub when edited)."""
    text, observed, _ = EPISODES[episode][turn - 1]
    tokens = [(ord(c), 1) for c in text]
    if observed and edited:
        return tokens + [(STUB + turn, 0)] * 2
    return tokens + [(OBSERVED + 10 * turn + i, 0) for i in range(observed)]


def flat_positions(episode: int) -> dict:
    """(turn, k) -> the column of the turn's k-th sampled token in the episode's one row."""
    out, col = {}, 0
    for turn in range(1, len(EPISODES[episode]) + 1):
        k = 0
        for _, sampled in turn_tokens(episode, turn, edited=False):
            if sampled:
                out[turn, k] = col
                k += 1
            col += 1
    return out


def layout(segmented: bool):
    """(batch, rewards per row, scores per row, origin): `origin[row][col]` is (episode, flat
    column) for every sampled token (context included), None elsewhere."""
    rows = []
    for e, turns in enumerate(EPISODES):
        where = flat_positions(e)
        bounds = [0, *(CUTS[e] if segmented else []), len(turns)]
        for j in range(len(bounds) - 1):
            tokens, turn_of, sampled, own, origin = [], [], [], [], []
            for turn in range(1, bounds[j + 1] + 1):
                context = turn <= bounds[j]
                k = 0
                for token, is_sampled in turn_tokens(e, turn, edited=context):
                    tokens.append(token)
                    turn_of.append(turn)
                    sampled.append(is_sampled)
                    own.append(is_sampled and not context)
                    origin.append((e, where[turn, k]) if is_sampled else None)
                    k += is_sampled
            final = j == len(bounds) - 2
            rows.append(dict(tokens=tokens, turns=turn_of, sampled=sampled, own=own, origin=origin, episode=e,
                             segment=j, context=sum(1 for t in turn_of if t <= bounds[j]), final=final,
                             pages=[list(p) for _, _, p in turns[: bounds[j + 1]]]))
    width = max(len(r["tokens"]) for r in rows) + 3  # padding after every row

    def tensor(key):
        return torch.tensor([r[key] + [0] * (width - len(r[key])) for r in rows], dtype=torch.long)

    pages = np.empty(len(rows), dtype=object)
    pages[:] = [r["pages"] for r in rows]
    response_mask = torch.tensor([[1] * len(r["tokens"]) + [0] * (width - len(r["tokens"])) for r in rows])
    tensors = {"responses": tensor("tokens"), "turn_ids": tensor("turns"), "loss_mask": tensor("own"),
               "response_mask": response_mask}
    columns = {"turn_page_ids": pages}
    if segmented:
        tensors["sampled_mask"] = tensor("sampled")
        columns.update(episode_id=np.array([r["episode"] for r in rows], dtype=np.int64),
                       segment_index=np.array([r["segment"] for r in rows], dtype=np.int64),
                       context_length=np.array([r["context"] for r in rows], dtype=np.int64))
    batch = SimpleNamespace(batch=tensors, non_tensor_batch=columns, meta_info={})
    # an earlier row's reward and score are not its episode's: they must be ignored
    rewards = [SCORES[r["episode"]]["overall"] if r["final"] else 99.0 - r["segment"] for r in rows]
    scores = [SCORES[r["episode"]] if r["final"] else BOGUS for r in rows]
    origin = [r["origin"] + [None] * (width - len(r["origin"])) for r in rows]
    return batch, rewards, scores, origin


def turn_rewards_of(batch, scores, preset, estimator="turn"):
    if preset is None:
        return None
    return [t.total for t in Credit(estimator, preset, CharTokenizer(), TRUTHS).turn_rewards(batch, scores)]


def advantages_of(batch, rewards, scores, estimator, preset):
    return estimator_advantages(batch, rewards, N, "loss_mask", estimator, turn_rewards_of(batch, scores, preset))


def trained_by(batch, origin):
    """flat (episode, column) -> (row, column) of the segment row token that trains it."""
    out = {}
    for row, col in batch.batch["loss_mask"].nonzero().tolist():
        assert origin[row][col] not in out, f"{origin[row][col]} trained twice"
        out[origin[row][col]] = (row, col)
    return out


def test_the_layouts_hold_the_same_sampled_tokens_at_other_columns():
    """The fixture itself: each flat sampled token trained by exactly one segment row, with the
    same token id and turn id, most at another column; every row's context holds each earlier
    turn's sampled tokens (as `check` proves of real batches)."""
    flat, _, _, _ = layout(False)
    cut, _, _, origin = layout(True)
    trained = trained_by(cut, origin)
    flat_tokens = {(e, c) for e, c in flat.batch["loss_mask"].nonzero().tolist()}
    assert set(trained) == flat_tokens
    moved = 0
    for (e, c), (row, col) in trained.items():
        assert cut.batch["responses"][row, col] == flat.batch["responses"][e, c]
        assert cut.batch["turn_ids"][row, col] == flat.batch["turn_ids"][e, c]
        moved += col != c
    assert moved > len(trained) // 3
    assert list(cut.non_tensor_batch["segment_index"]) == [0, 1, 2, 0, 1, 2, 0, 0, 1]
    for row in range(len(origin)):
        context = int(cut.non_tensor_batch["context_length"][row])
        held = [o for o in origin[row][:context] if o is not None]
        earlier = [o for o in origin[row - 1] if o is not None] if cut.non_tensor_batch["segment_index"][row] else []
        assert held == earlier


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("preset", PRESETS)
def test_turn_level_estimators_give_one_value_per_turn(estimator, preset):
    """One row an episode (the oracle): a turn's sampled tokens share one advantage, and the
    episode's turns do not all share one (else mapping by turn would prove little), but for `turn`
    on the outcome alone (every turn's reward-to-go is the outcome, every baseline the others')."""
    flat, rewards, scores, _ = layout(False)
    advantages = advantages_of(flat, rewards, scores, estimator, preset)
    sampled = flat.batch["loss_mask"].bool()
    varied = 0
    for e in range(len(EPISODES)):
        per_turn = []
        for turn in range(1, len(EPISODES[e]) + 1):
            values = advantages[e][sampled[e] & (flat.batch["turn_ids"][e] == turn)]
            assert torch.equal(values, values[:1].expand_as(values)), (e, turn, values)
            per_turn.append(float(values[0]))
        varied += len(set(per_turn)) > 1
    assert (varied > 0) == (OUTCOME_ONLY != (estimator, preset in (None, "off")))
    assert (advantages[~sampled] == 0).all()


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("preset", PRESETS)
def test_every_sampled_token_gets_its_one_row_advantage_on_the_row_that_trains_it(estimator, preset):
    flat, flat_rewards, flat_scores, _ = layout(False)
    cut, rewards, scores, origin = layout(True)
    expected = advantages_of(flat, flat_rewards, flat_scores, estimator, preset)
    got = advantages_of(cut, rewards, scores, estimator, preset)
    trained = trained_by(cut, origin)
    for (e, c), (row, col) in trained.items():
        assert got[row, col] == expected[e, c], (estimator, preset, e, c, row, col)
    assert (got[~cut.batch["loss_mask"].bool()] == 0).all()
    # a cut episode's rows carry different values (turn credit, not one value per episode)
    rows_of_0 = [float(got[row][cut.batch["loss_mask"][row].bool()][0]) for row in range(3)]
    assert (len(set(rows_of_0)) > 1) == (OUTCOME_ONLY != (estimator, preset in (None, "off"))), rows_of_0


@pytest.mark.parametrize("preset", ("off", "retrieval", "on"))
def test_per_turn_rewards_and_metrics_are_the_episodes(preset):
    """Per-turn rewards of a segmented batch: its final rows' (every turn, the episode's score, each
    turn's text through `sampled_mask` for repeated queries and invalid actions), carried by every
    row of the episode; the credit metrics count each episode once."""
    flat, _, flat_scores, _ = layout(False)
    cut, _, scores, _ = layout(True)
    ids = cut.non_tensor_batch["episode_id"]
    for estimator in ESTIMATORS:
        credit = Credit(estimator, preset, CharTokenizer(), TRUTHS)
        one_row, segmented = credit.turn_rewards(flat, flat_scores), credit.turn_rewards(cut, scores)
        for row, episode in enumerate(ids):
            assert segmented[row].total == one_row[episode].total and segmented[row].parts == one_row[episode].parts
        assert credit.metrics(cut, segmented, N) == credit.metrics(flat, one_row, N)
    if preset == "on":  # the shaping parts read the context turns' text: episode 0 repeats a query,
        parts = segmented[last_rows(cut)[0]].parts  # episode 1 sends an empty search
        assert parts["repeat_query"][1] < 0 and parts["invalid"] == [0.0] * 4
        assert Credit("turn", preset, CharTokenizer(), TRUTHS).turn_rewards(cut, scores)[5].parts["invalid"][1] < 0


def episode_rows(batch, rows):
    """The sub-batch of `rows` (one episode's), its segment columns kept."""
    index = torch.tensor(rows)
    return SimpleNamespace(batch={k: v[index] for k, v in batch.batch.items()},
                           non_tensor_batch={k: np.asarray(v)[rows] for k, v in batch.non_tensor_batch.items()},
                           meta_info={})


def log_probs(flat, cut, origin, seed=0):
    """(new, old) per flat token, and the same values at each segment row's copy of the token."""
    g = torch.Generator().manual_seed(seed)
    new = -torch.rand(flat.batch["responses"].shape, generator=g) * 2
    old = new + (torch.rand(new.shape, generator=g) - 0.5) * 0.6  # ratios off 1: clipping plays a part
    seg_new, seg_old = torch.zeros(cut.batch["loss_mask"].shape), torch.zeros(cut.batch["loss_mask"].shape)
    for row, cols in enumerate(origin):
        for col, o in enumerate(cols):
            if o is not None:
                seg_new[row, col], seg_old[row, col] = new[o], old[o]
    return new, old, seg_new, seg_old


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("preset", ("off", "on"))
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_each_episodes_loss_and_gradient_are_its_one_row_loss_and_gradient(estimator, preset, mode):
    flat, flat_rewards, flat_scores, _ = layout(False)
    cut, rewards, scores, origin = layout(True)
    new, old, seg_new, seg_old = log_probs(flat, cut, origin)
    config = actor_config(N, loss_agg_mode=mode)
    flat_adv = advantages_of(flat, flat_rewards, flat_scores, estimator, preset)
    cut_adv = advantages_of(cut, rewards, scores, estimator, preset)
    ids = cut.non_tensor_batch["episode_id"].tolist()
    for e in range(len(EPISODES)):
        rows = [row for row, episode in enumerate(ids) if episode == e]
        one, _ = episode_policy_loss(new[e:e + 1], old[e:e + 1], flat_adv[e:e + 1], episode_rows(flat, [e]), config)
        index = torch.tensor(rows)
        its, _ = episode_policy_loss(seg_new[index], seg_old[index], cut_adv[index], episode_rows(cut, rows), config)
        assert float(its) == pytest.approx(float(one), rel=1e-6, abs=1e-7), (e, mode)
    # the whole batch: its loss, and the gradient of every flat token folded back from its row
    flat_lp, cut_lp = new.clone().requires_grad_(True), seg_new.clone().requires_grad_(True)
    loss_one, _ = episode_policy_loss(flat_lp, old, flat_adv, flat, config)
    loss_cut, _ = episode_policy_loss(cut_lp, seg_old, cut_adv, cut, config)
    assert float(loss_cut.detach()) == pytest.approx(float(loss_one.detach()), rel=1e-6, abs=1e-7)
    loss_one.backward()
    loss_cut.backward()
    folded = torch.zeros_like(new)
    for (e, c), (row, col) in trained_by(cut, origin).items():
        folded[e, c] = cut_lp.grad[row, col]
    torch.testing.assert_close(folded, flat_lp.grad * flat.batch["loss_mask"], rtol=1e-5, atol=1e-7)
    assert flat_lp.grad.abs().sum() > 0


@pytest.mark.parametrize("preset", PRESETS)
def test_grpo_on_segments_is_per_episode_as_before(preset):
    """`grpo` without per-turn rewards is `segments.episode_advantages`, bit for bit; with them, each
    episode's summed turn rewards (its final row's), the one-row advantages on every trained token."""
    flat, flat_rewards, flat_scores, _ = layout(False)
    cut, rewards, scores, origin = layout(True)
    turns = turn_rewards_of(cut, scores, preset, "grpo")
    got = estimator_advantages(cut, rewards, N, "loss_mask", "grpo", turns)
    if preset in (None, "off"):
        assert torch.equal(got, episode_advantages(cut, rewards, N))
    flat_turns = turn_rewards_of(flat, flat_scores, preset, "grpo")
    expected = estimator_advantages(flat, flat_rewards, N, "loss_mask", "grpo", flat_turns)
    for (e, c), (row, col) in trained_by(cut, origin).items():
        assert got[row, col] == pytest.approx(float(expected[e, c]), abs=1e-6)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_control_each_row_credited_as_a_sample_of_its_own_differs(estimator):
    """The pitfall the oracle tells apart: turn credit run over the segment rows as if each were an
    episode (rightly grouped by prompt) counts a cut episode several times in its group's baselines
    and gives a row's turns no reward-to-go from the turns after it."""
    flat, flat_rewards, flat_scores, _ = layout(False)
    cut, rewards, scores, origin = layout(True)
    expected = advantages_of(flat, flat_rewards, flat_scores, estimator, "retrieval")
    turns = turn_rewards_of(cut, scores, "retrieval")
    per_row = [t[: len(p)] for t, p in zip(turns, cut.non_tensor_batch["turn_page_ids"])]
    index = [int(e) // N for e in cut.non_tensor_batch["episode_id"]]
    rowwise = credit_advantages(estimator, cut, rewards, N, "loss_mask", per_row, index=index)
    wrong = sum(rowwise[row, col] != expected[e, c] for (e, c), (row, col) in trained_by(cut, origin).items())
    assert wrong > 0


def test_a_context_that_does_not_hold_the_earlier_turns_verbatim_is_refused():
    cut, rewards, scores, origin = layout(True)
    turns = turn_rewards_of(cut, scores, "on")
    estimator_advantages(cut, rewards, N, "loss_mask", "turn", turns)  # as built: accepted
    # episode 0's first row trains turn 1, which its final row (row 2) holds as context: change
    # one of the first row's sampled tokens, as if the context had not kept it verbatim
    col = int(cut.batch["loss_mask"][0].nonzero()[3])
    changed = layout(True)[0]
    changed.batch["responses"][0, col] += 1
    with pytest.raises(ValueError, match="row 0: its sampled tokens of turn 1 are not its episode's final row 2"):
        estimator_advantages(changed, rewards, N, "loss_mask", "turn", turns)
    # a final row without sampled_mask cannot tell its context turns from its observations
    del changed.batch["sampled_mask"]
    with pytest.raises(ValueError, match="without sampled_mask"):
        estimator_advantages(changed, rewards, N, "loss_mask", "gigpo", turns)


def test_learn_takes_turn_credit_with_a_context_policy(monkeypatch, tmp_path):
    """The refusal is gone: `learn --estimator turn --turn-rewards retrieval --context-keep-turns 1`
    reaches the run with both (the run itself is the next test's)."""
    from vrag_rollout import cli
    from vrag_rollout.devkit import job_checks, learn_job

    given = {}
    monkeypatch.setattr(learn_job, "run_learn", lambda out, **kwargs: given.update(kwargs))
    monkeypatch.setattr(job_checks, "check_retriever", lambda *args, **kwargs: None)
    code = cli.main(["learn", "--out", str(tmp_path / "run"), "--estimator", "turn", "--turn-rewards", "retrieval",
                     "--context-keep-turns", "1", "--retriever-url", "http://127.0.0.1:9"])
    assert code == 0
    assert given["estimator"] == "turn" and given["turn_rewards"] == "retrieval"
    assert given["context"]["context_keep_turns"] == 1


def test_a_real_learn_step_trains_cut_episodes_with_turn_credit(tmp_path, tiny_model_dir, tiny_processor, tiny_llm):
    """One step of `learn --estimator turn --turn-rewards retrieval` under a context policy on the
    tiny model's engine (the learn loop test's segmented run's policy): episodes are cut into rows,
    the metrics line carries the turn credit, and every trained token of every row carries the
    `turn` value of its turn, computed here by `estimators.turn_rtg_values` from each episode's
    per-turn rewards (its final row's), grouped by prompt."""
    from transformers import AutoModelForImageTextToText

    from tests.rollout.learn_runs import SEGMENTED, SETTINGS, fixture_retriever
    from vrag_rollout.devkit.learn_job import run_learn
    from vrag_rollout.engine.weights import check_synced, sync_weights
    from vrag_rollout.training import grpo
    from vrag_rollout.training.estimators import turn_rtg_values

    original = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    seen, real = [], grpo.grpo_loss

    def recording(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append((args[2], kwargs, out[2].detach().clone()))
        return out

    sync_weights(tiny_llm, original)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(grpo, "grpo_loss", recording)
            result = run_learn(tmp_path, **{**SETTINGS, "steps": 1, "batch_size": 1}, model_dir=tiny_model_dir,
                               processor=tiny_processor, llm=tiny_llm, retriever=fixture_retriever(),
                               progress=False, evaluate=False, estimator="turn", turn_rewards="retrieval",
                               context=SEGMENTED)
    finally:  # other tests share the engine
        sync_weights(tiny_llm, original)
        check_synced(tiny_llm, original, tiny_processor)
    record = result["records"][0]
    assert record["estimator"] == "turn"
    assert "advantage/turn/1/mean" in record and "reward/turn/retrieval/mean" in record
    (batch, kwargs, advantages), = seen
    assert kwargs["estimator"] == "turn"
    ids = batch.non_tensor_batch["episode_id"]
    ends = last_rows(batch)
    assert len(ids) > len(ends), "no episode was cut into rows: the step proves nothing"
    finals = [kwargs["turn_rewards"][row] for row in ends]
    assert all(len(t) == int(batch.non_tensor_batch["num_turns"][row]) for t, row in zip(finals, ends))
    values = turn_rtg_values(finals, [int(ids[row]) // SETTINGS["n"] for row in ends])
    of_episode = {int(ids[row]): v for row, v in zip(ends, values)}
    trained = batch.batch["loss_mask"].bool()
    expected = torch.zeros(advantages.shape)
    for row, episode in enumerate(ids):
        turns = batch.batch["turn_ids"][row]
        expected[row][trained[row]] = torch.tensor(of_episode[int(episode)])[turns[trained[row]] - 1]
    torch.testing.assert_close(advantages, expected, rtol=0, atol=1e-6)
    assert len({tuple(v) for v in values if len(set(v)) > 1}) > 0  # turns of an episode got different values
