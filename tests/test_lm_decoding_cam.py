"""kvpress's CAMPress replayed on every Q row (issue 49, item 1).

At temperature 0 each Q row equals kvpress's own ``generate`` inside the same press on that row
alone, with torch's global generator seeded with the row's merge seed, over 256 generated
positions spanning four compressions with merges drawn; forks carry a row's attention sums and
generator; an estimator that goes back (SWRB) is refused before anything is written.
"""

from __future__ import annotations

import kvpress
import pytest
import torch

from kvdrift.data.document import Document
from kvdrift.lm.actions.spec import parse_action
from kvdrift.lm.engine.decoding_cam import SWRB_REFUSAL, CamRule, merge_seed
from kvdrift.lm.engine.decoding_presses import decoding_rule
from kvdrift.lm.engine.pair import LMKernelPair
from kvdrift.lm.factory import DriverSide, check_actions_fit
from tests.test_lm_press_path import general_pair, generate_in, greedy_q
from tests.test_lm_presses import prompt

LONG = 256  # generated positions of the equality tests
N = 60  # prompt tokens
SIDE = DriverSide(name="m", tokenizer=None, build=lambda: None, context_window=None, layers=2)


def cam(interval: int = 64, target: int = 48, merge: int = 8, buffer: int = 4,
        scorer=None) -> kvpress.CAMPress:
    """Compresses after 64, 128, 192 and 256 generated tokens (60 + 64 > 48 entries)."""
    return kvpress.CAMPress(base_press=scorer or kvpress.KnormPress(),
                            compression_interval=interval, target_size=target,
                            merge_budget=merge, hidden_states_buffer_size=buffer)


class Draws:
    """Counts kvpress's merge draws (``torch.bernoulli`` calls) and the merges drawn."""

    def __init__(self) -> None:
        self.calls, self.merges = 0, 0
        self._bernoulli = torch.bernoulli

    def __call__(self, *args, **kwargs):
        out = self._bernoulli(*args, **kwargs)
        self.calls += 1
        self.merges += int(out.sum())
        return out


def generate_seeded(model, ids, press, steps: int, seed: int, eos_allowed: bool = False):
    """kvpress's generate inside ``press`` with torch's global generator seeded with ``seed``
    (the caller's random state restored afterwards)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return generate_in(model, ids, press, steps, eos_allowed=eos_allowed)


def test_a_cam_press_object_equals_generate_inside_it(tiny_llama, monkeypatch):
    """One Q row (row 0, merge key 0) over 256 positions: four compressions in each of the 2
    layers, merges drawn at each, tokens equal generate's with the row's merge seed."""
    ids = prompt(N)
    pair = general_pair(tiny_llama, ids, cam())
    assert isinstance(pair.decoding_rule, CamRule)
    draws = Draws()
    monkeypatch.setattr(torch, "bernoulli", draws)
    got = greedy_q(pair, LONG)
    monkeypatch.undo()
    assert draws.calls == 4 * 2  # one draw per compression and layer, as kvpress
    assert draws.merges > 0  # values were merged
    assert got == generate_seeded(tiny_llama, ids, cam(), LONG, merge_seed(0, 0))
    assert got != generate_in(tiny_llama, ids, None, LONG)  # the press changed Q's tokens


def test_a_named_cam_spec_and_its_press_object_agree_token_for_token(tiny_llama):
    ids = prompt(N)
    spec = "cam-knorm:interval=64,target=48,merge=8,buffer=4"
    action = parse_action(spec)
    assert action.kvpress_call() == ("CAMPress(base_press=KnormPress(), "
                                     "hidden_states_buffer_size=4, compression_interval=64, "
                                     "merge_budget=8, target_size=48)")
    pair = LMKernelPair(tiny_llama, ids, spec)
    assert isinstance(pair.decoding_rule, CamRule) and pair.decoding_rule.spec
    assert greedy_q(pair, LONG) == greedy_q(general_pair(tiny_llama, ids, cam()), LONG)


@pytest.mark.parametrize("spec, says", [
    ("cam-knorm:interval=64", r"give target=T"),
    ("cam-knorm:interval=64,ratio=0.5", r"CAMPress takes target= .* not ratio=$"),
    ("cam-knorm:interval=64,target=40,merge=0", r"merge must be an integer >= 1; got 0$"),
])
def test_a_cam_spec_without_its_fields_is_refused_when_parsed(spec, says):
    with pytest.raises(ValueError, match=says):
        parse_action(spec)


def test_a_cam_spec_under_swrb_or_beyond_the_horizon_is_refused_at_start():
    with pytest.raises(ValueError, match=r"^action 'cam-knorm:interval=64,target=40': its "
                                         r"CAMPress merges evicted values"):
        check_actions_fit(["cam-knorm:interval=64,target=40"], SIDE, horizon=256,
                          estimator="swrb")
    with pytest.raises(ValueError, match=r"its CAMPress compresses first after interval=300 "
                                         r"generated tokens, beyond the horizon H = 256"):
        check_actions_fit(["cam-knorm:interval=300,target=40"], SIDE, horizon=256)


def test_the_recorded_schedule_is_when_cam_compresses(tiny_llama):
    """CAMPress compresses once a layer has taken interval steps and holds more than target
    entries: 60 prompt tokens, target 70, interval 8 compress after 11 (the first step above
    70 entries), 19 and 27; the records' schedule says so."""
    from kvdrift.records.generation import Schedule

    pair = general_pair(tiny_llama, prompt(N), cam(interval=8, target=70))
    state, seen = pair.start("q", 1), []
    for t, token in enumerate(prompt(30, seed=11)[0].tolist()):
        state = pair.advance(state, torch.tensor([token]))
        if int(state.evictions.steps.max()) == 0:
            seen.append(t + 1)
    assert seen == [11, 19, 27]
    assert Schedule.of_rule(pair.decoding_rule, 30).compressions == ((11, 70), (19, 70),
                                                                     (27, 70))
    assert Schedule.of_rule(general_pair(tiny_llama, prompt(N), cam()).decoding_rule,
                            LONG).compressions == ((64, 48), (128, 48), (192, 48), (256, 48))


def test_merge_seeds_depend_on_the_key_and_the_row():
    seeds = {merge_seed(key, row) for key in (0, 1, 2**62) for row in range(50)}
    assert len(seeds) == 150 and all(0 <= s < 2**63 for s in seeds)
    assert merge_seed(7, 3) == merge_seed(7, 3)
    assert len({s & 0xFFFFFFFF for s in seeds}) == 150  # distinct CPU streams too


def test_a_forked_row_carries_its_sums_and_generator(tiny_llama):
    """A row forked after its first compression and advanced along the same tokens as its
    parent row gives the parent's next-token distributions (to float noise: batches of other
    shapes) through the second compression: its running attention sums, merged values and
    merge generator went with it. Truncating back is refused in CAM's terms."""
    pair = general_pair(tiny_llama, prompt(N), cam(interval=24, target=40))
    state = pair.start("q", 2, rewind=False)
    tokens = prompt(60, seed=11)[0]
    for t in range(30):  # compresses after 24
        state = pair.advance(state, torch.stack([tokens[t], tokens[t]]))
    fork = pair.select(state, torch.tensor([1]))
    for t in range(30, 52):  # compresses after 48
        state = pair.advance(state, torch.stack([tokens[t], tokens[t]]))
        fork = pair.advance(fork, tokens[t:t + 1])
        torch.testing.assert_close(pair.logprobs(fork)[0], pair.logprobs(state)[1],
                                   rtol=0, atol=1e-5)
    assert int(fork.evictions.steps.max()) == 52 - 48
    assert torch.equal(fork.evictions.rng[0], state.evictions.rng[1])
    assert not torch.equal(state.evictions.rng[0], state.evictions.rng[1])  # own generators
    with pytest.raises(ValueError, match=r"^row 0 cannot go back to length 40: under CAMPress "
                                         r"it holds merged values"):
        pair.truncate(fork, torch.tensor([40]))
    joined = pair.join([fork, pair.select(state, torch.tensor([0]))])
    assert torch.equal(joined.evictions.rng, state.evictions.rng.flip(0))


def test_through_the_runner_every_q_row_equals_generate_alone(tiny_model_dir):
    """K = 3 rows of Y stepped as one batch at temperature 0 (X forks Q's rows where they
    diverge): row r equals generate inside CAMPress on the prompt alone, torch's global
    generator seeded with merge_seed(unit seed, r), over 256 positions."""
    from kvdrift.lm.factory import LMPairFactory
    from kvdrift.lm.loading.model import load_model
    from kvdrift.run.runner import RunConfig, unit_records, unit_seed

    loaded = load_model(str(tiny_model_dir), "cpu", "float32")
    factory = LMPairFactory(loaded, presses={"cam": cam(target=40, merge=4)})
    doc = Document(id="d0", prompt=" ".join(f"word{i} is here, and the story goes on"
                                            for i in range(8)))
    config = RunConfig(model="tiny", actions=("cam",), replicates=3, horizon=LONG,
                       temperature=0.0, seed=5)
    steps, _ = unit_records(config, doc, "cam", factory)
    ids = factory.prompt_ids(doc)
    rows = steps.to_pylist()
    key = unit_seed(5, "d0")
    wants = [generate_seeded(loaded.model, ids, cam(target=40, merge=4), LONG,
                             merge_seed(key, r), eos_allowed=True) for r in range(3)]
    assert len(wants[0]) == LONG
    for r in range(3):
        assert [s["y_token"] for s in rows if s["replicate"] == r] == wants[r]
    assert len({tuple(w) for w in wants}) > 1  # the rows' merges differ



def test_swrb_under_cam_is_refused_at_start_and_rollouts_run():
    with pytest.raises(ValueError) as info:
        check_actions_fit(["mine"], SIDE, {"mine": cam()}, 256, estimator="swrb")
    assert str(info.value) == f"action 'mine': {SWRB_REFUSAL}"
    check_actions_fit(["mine"], SIDE, {"mine": cam()}, 256, estimator="rollout")
    check_actions_fit(["mine"], SIDE, {"mine": kvpress.PrefillDecodingPress(
        prefilling_press=kvpress.KnormPress(0.5), decoding_press=cam())}, 256)


def test_kvdrift_run_with_swrb_under_cam_writes_nothing_and_rollouts_run(tiny_model_dir,
                                                                         tmp_path):
    from typer.testing import CliRunner

    from kvdrift.cli import app
    from kvdrift.data.loaders import write_jsonl

    docs = tmp_path / "docs.jsonl"
    write_jsonl([Document(id="d0", prompt="The cat sat on the mat. " * 12)], docs)
    out = tmp_path / "run"
    spec = "cam-knorm:interval=4,target=40,merge=2"

    def run(estimator: str):
        return CliRunner().invoke(app, ["run", "--model", str(tiny_model_dir), "--docs",
                                        str(docs), "--actions", spec, "--replicates", "2",
                                        "--horizon", "12", "--estimator", estimator,
                                        "--out", str(out)])

    bad = run("swrb")
    assert bad.exit_code == 2, bad.output
    assert f"action '{spec}': its CAMPress merges evicted values" in bad.output
    assert "Traceback" not in bad.output and not out.exists()
    good = run("rollout")
    assert good.exit_code == 0, good.output
    assert (out / "run.json").exists()


class OwnCompress(kvpress.CAMPress):
    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        return keys, values


@pytest.mark.parametrize("make, says", [
    (lambda: OwnCompress(base_press=kvpress.KnormPress()),
     r"^action 'p': OwnCompress overrides CAMPress's compress, so it compresses during "
     r"decoding in its own way"),
    (lambda: kvpress.CAMPress(base_press=kvpress.AdaKVPress(kvpress.KnormPress())),
     r"^action 'p': its CAMPress scores with AdaKVPress, but CAMPress calls its base_press's "
     r"score, which only a ScorerPress has"),
    (lambda: kvpress.PrefillDecodingPress(
        prefilling_press=kvpress.AdaKVPress(kvpress.KnormPress(0.5)), decoding_press=cam()),
     r"^action 'p': its prefilling_press AdaKVPress hides entries per KV head, and its "
     r"CAMPress keeps and merges the same entries in every KV head"),
    (lambda: cam(interval=300),
     r"^action 'p': its CAMPress compresses first after compression_interval=300 generated "
     r"tokens, beyond the horizon H = 256"),
])
def test_a_cam_press_kvdrift_does_not_replay_is_refused_in_its_own_terms(make, says):
    with pytest.raises(ValueError, match=says):
        rule = decoding_rule(make(), "p")
        rule.check("p", 256)


@pytest.mark.slow
def test_cam_on_smollm2_equals_generate_over_256_positions(monkeypatch, embedded_smollm2):
    """The named spec on SmolLM2 (30 layers), a short prompt: four compressions in every layer
    with merges drawn, tokens equal generate's inside the same CAMPress with the row's seed."""
    from kvdrift.lm.loading.model import encode_prompt

    loaded = embedded_smollm2
    ids = encode_prompt(loaded.tokenizer, "Rivers carve valleys; explain how a fjord forms.")
    spec = "cam-knorm:interval=64,target=48,merge=8,buffer=0"
    pair = LMKernelPair(loaded.model, ids, spec)
    draws = Draws()
    monkeypatch.setattr(torch, "bernoulli", draws)
    got = greedy_q(pair, LONG)
    monkeypatch.undo()
    assert draws.calls == 4 * loaded.model.config.num_hidden_layers and draws.merges > 0
    want = generate_seeded(loaded.model, ids, parse_action(spec).make_press(ids.shape[-1]),
                           LONG, merge_seed(0, 0))
    assert got == want
