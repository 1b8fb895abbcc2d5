"""The habits world (dapo/tinyworld/habits.py): problems of each kind, solutions written with each habit, and the
tags that count the habits in any response, checked on hand-written examples."""

import math
import random
from collections import Counter

import pytest

from dapo import metric_names as M
from dapo.tinyworld import habits as H
from dapo.types import GroupOutcome

MIX = H.Mix(easy=0.25, fork=0.2, long=0.1, unsolvable=0.15)
PLAIN = H.Habits(verbose=0.0, loop=0.0, loop_slip=0.0, fork_right=1.0, slip=0.0)


def _ops(task):
    return [(s.op, s.b) for s in task.steps]


def test_each_kind_has_its_operations_and_only_its_own_markers():
    rng = random.Random(0)
    for kind in H.KINDS:
        for _ in range(300):
            t = H.make_task(rng, kind)
            assert H.problem_kind(t.text) == kind, t.text
            lo, hi = H.N_OPS[kind]
            assert lo <= t.n_ops <= hi
            ops = _ops(t)
            # the fork's markers are the fork's alone: one halving (the fork) and no other "- 2"
            if kind == H.FORK:
                assert ops.count(("/", 2)) == 1 and ("-", 2) not in ops and t.text.count(H.FORK_PHRASE) == 1
            assert (H.SQUARE_PHRASE in t.text) == (kind == H.UNSOLVABLE)
            assert t.answer > 0


def test_splits_are_seeded_disjoint_and_keep_the_squaring_step_out_of_the_supervised_data():
    a, b, c = (H.make_splits(s, MIX, 400, 40, 600) for s in (3, 3, 4))
    assert [t.text for t in a.train] == [t.text for t in b.train] and a.train != c.train
    train, ev = {t.text for t in a.train}, {t.text for t in a.eval}
    assert not train & ev and not ev & {t.text for t in a.sft}
    assert not any(H.SQUARE_PHRASE in t.text for t in a.sft)
    # the eval split has the mix's shares exactly (40 problems: 10 easy, 12 core, 8 fork, 4 long, 6 unsolvable)
    assert Counter(H.problem_kind(t.text) for t in a.eval) == {
        "easy": 10,
        "core": 12,
        "fork": 8,
        "long": 4,
        "unsolvable": 6,
    }
    large = H.make_large_eval(3, MIX, 40, train | ev)
    assert not {t.text for t in large} & (train | ev)
    assert [t.text for t in H.make_large_eval(3, MIX, 20, train | ev)][:5] == [t.text for t in large][:5]


def test_the_supervised_problems_can_follow_a_mix_of_their_own_and_the_rl_prompts_stay_the_same():
    """tiny.sft_mix_*: what the base model practised, apart from the RL prompts' mix; unset, the world is as before
    (its hash and its supervised problems)."""
    from dapo.config import load_config
    from dapo.tinyworld.build import KEYS_ADDED_LATER, SFT_BATCH, habits_mix, world_hash, world_splits

    unset = {"sft_mix_easy": None, "sft_mix_fork": None, "sft_mix_long": None}
    base = load_config(preset="tiny-habits").tiny.model_copy(update={"n_train": 300, "sft_steps": 40, **unset})
    own = base.model_copy(update={"sft_mix_easy": 0.0, "sft_mix_long": 0.0})  # fork: the RL mix's
    assert own.sft_mix() == (0.0, base.mix_fork, 0.0) and base.sft_mix() is None
    a, b = world_splits(base), world_splits(own)
    assert [t.text for t in a.train] == [t.text for t in b.train] and [t.text for t in a.eval] == [
        t.text for t in b.eval
    ]
    kinds = Counter(H.problem_kind(t.text) for t in b.sft)
    assert set(kinds) == {H.CORE, H.FORK} and 0.10 < kinds[H.FORK] / len(b.sft) < 0.20  # fork .15, core the rest
    assert world_hash(own) != world_hash(base)
    # unset: the supervised problems the call without a mix of their own drew (worlds built before keep them), and
    # the keys stay out of the hash (KEYS_ADDED_LATER)
    before = H.make_splits(base.seed, habits_mix(base), base.n_train, base.n_eval, base.sft_steps * SFT_BATCH)
    assert [t.text for t in a.sft] == [t.text for t in before.sft]
    assert all(KEYS_ADDED_LATER[k] is None for k in unset)


def test_a_plain_solution_is_right_and_each_habit_writes_what_it_says():
    rng = random.Random(1)
    tasks = [H.make_task(rng, k) for k in (H.CORE, H.FORK, H.LONG) for _ in range(50)]
    for t in tasks:
        lines, style = H.solution_lines(t, PLAIN, rng)
        assert style == "concise" and lines[-1] == f"Answer: {t.answer}"
        assert H.tag_response(t.text, "\n".join(lines), truncated=False) == (
            (H.FORK_RIGHT,) if H.FORK_PHRASE in t.text else ()
        )
    fork = next(t for t in tasks if H.FORK_PHRASE in t.text)
    wrong, _ = H.solution_lines(fork, H.Habits(0, 0, 0, fork_right=0.0, slip=0), rng)
    assert wrong[-1] != f"Answer: {fork.answer}" and H.tag_response(fork.text, "\n".join(wrong), False) == (
        H.FORK_WRONG,
    )
    verbose, style = H.solution_lines(tasks[0], H.Habits(1.0, 0, 0, 1.0, 0), rng)
    assert style == "verbose" and verbose[0].endswith(f"has {tasks[0].start} {tasks[0].obj}.")
    assert verbose[-1] == f"Answer: {tasks[0].answer}" and H.VERBOSE in H.tag_response(
        tasks[0].text, "\n".join(verbose), False
    )
    loop, style = H.solution_lines(tasks[0], H.Habits(0, 1.0, loop_slip=1.0, fork_right=1.0, slip=0), rng)
    agains = [ln for ln in loop if ln.startswith(H.AGAIN)]
    assert style == "loop" and 1 <= len(agains) <= 2 and len(set(agains)) == 1  # one slipped re-check, repeated
    assert loop[-1] != f"Answer: {tasks[0].answer}"  # the slip is carried to the answer
    assert H.LOOP in H.tag_response(tasks[0].text, "\n".join(loop), False)


def test_combined_working_writes_each_pairs_result_only_and_leaves_the_fork_and_the_other_styles_alone():
    rng = random.Random(2)
    combined = H.Habits(0, 0, 0, fork_right=1.0, slip=0, combine=1.0)
    for kind in (H.EASY, H.CORE, H.FORK, H.LONG):
        for _ in range(40):
            t = H.make_task(rng, kind)
            lines, style = H.solution_lines(t, combined, rng)
            work = lines[:-1]
            assert style == H.CONCISE and lines[-1] == f"Answer: {t.answer}"  # no slip: pairs are worked right
            if kind in (H.EASY, H.FORK):  # one operation, or the fork's line must stay readable: plain lines
                assert len(work) == t.n_ops and not any(H.THEN in ln for ln in work)
            else:  # 2-6 operations in ceil(n / 2) lines; each pair names both operations and one result
                assert len(work) == (t.n_ops + 1) // 2
                assert all(ln.count("=") == 1 for ln in work)
                assert sum(ln.count(H.THEN) for ln in work) == t.n_ops // 2
    t = H.make_task(random.Random(5), H.CORE)
    other = {
        "verbose": H.Habits(1.0, 0, 0, 1.0, 0, combine=1.0),
        "loop": H.Habits(0, 1.0, 0, 1.0, 0, combine=1.0),
    }
    for style, habits in other.items():
        lines, got = H.solution_lines(t, habits, random.Random(0))
        assert got == style and not any(H.THEN in ln for ln in lines)


MIA = "Mia has 6 apples. She buys 4 more. She loses half of them. She gives away 3. How many apples does Mia have now?"


@pytest.mark.parametrize(
    "response, truncated, tags",
    [
        ("6 + 4 = 10\n10 / 2 = 5\n5 - 3 = 2\nAnswer: 2", False, (H.FORK_RIGHT,)),
        ("6 + 4 = 10\n10 - 2 = 8\n8 - 3 = 5\nAnswer: 5", False, (H.FORK_WRONG,)),
        ("Mia has 6 apples.\nShe buys 4 more: 6 + 4 = 10.\nShe loses half", True,
         (H.VERBOSE, H.SOUND_TRUNCATED)),
        # cut off after a wrong line: not sound
        ("Mia has 6 apples.\nShe buys 4 more: 6 + 4 = 11.\nShe loses half", True, (H.VERBOSE,)),
        # cut off before any operation line was complete: not working yet
        ("Mia has 6 apples.\nShe buys 4", True, (H.VERBOSE,)),
        ("6 + 4 = 10\nagain: 6 + 4 = 11\nagain: 6 + 4 = 11\n11 - 2 = 9", True, (H.LOOP, H.FORK_WRONG)),
    ],
)  # fmt: skip
def test_tags_read_the_markers_of_hand_written_responses(response, truncated, tags):
    assert H.tag_response(MIA, response, truncated) == tags


def test_the_build_profile_splits_accuracy_and_truncation_by_working_style_and_problem_kind():
    from dapo.tinyworld.measure import habits_profile

    long = H.make_task(random.Random(2), H.LONG).text
    verbose_cut = ("Mia has 6 apples.\nShe buys 4 more: 6 + 4 = 10.\nShe loses half", True)
    samples = [
        [verbose_cut, ("6 + 4 = 10\n10 / 2 = 5\n5 - 3 = 2\nAnswer: 2", False)],  # MIA: cut verbose, right concise
        [("6 + 4 = 10\nagain: 6 + 4 = 11\nAnswer: 1", False), ("Answer: 3", False)],  # long: loop, concise
    ]
    p = habits_profile([MIA, long], samples, [[False, True], [False, False]])
    by = p["by_style"]
    assert by[H.VERBOSE] == {H.FORK: {"share": 0.5, "accuracy": 0.0, "truncated": 1.0}}
    assert by[H.CONCISE] == {
        H.FORK: {"share": 0.5, "accuracy": 1.0, "truncated": 0.0},
        H.LONG: {"share": 0.5, "accuracy": 0.0, "truncated": 0.0},
    }
    assert by[H.LOOP] == {H.LONG: {"share": 0.5, "accuracy": 0.0, "truncated": 0.0}}
    assert p["accuracy_by_kind"] == {H.FORK: 0.5, H.LONG: 0.0} and p["zero_adv_group_fraction"] == 0.5


def test_the_tagger_turns_a_steps_groups_into_habit_metrics():
    from dapo.types import GroupOutcome

    fork = GroupOutcome([True, False, False, False], [1, -1, -1, -1], [9, 9, 30, 9], [False] * 4,
                        [[H.FORK_RIGHT], [H.FORK_WRONG], [H.LOOP, H.FORK_WRONG], []], kind=H.FORK)  # fmt: skip
    easy = GroupOutcome([True, True], [1, 1], [5, 20], [False, False], [[], [H.VERBOSE]], kind=H.EASY)
    m = H.Tagger().metrics([fork, easy])
    assert m[M.HABIT_FORK_RIGHT] == 1 / 4 and m[M.HABIT_FORK_WRONG] == 2 / 4  # of the fork problem's responses
    assert m[M.HABIT_LOOP] == 1 / 6 and m[M.HABIT_VERBOSE] == 1 / 6 and m[M.HABIT_SOUND_TRUNCATED] == 0
    assert m[M.HABIT_ACC_FORK] == 1 / 4 and m[M.HABIT_ACC_EASY] == 1.0 and M.HABIT_ACC_LONG not in m
    # by working style, over both groups: concise 2 of 4 right, the one loop wrong, the one verbose answer right
    assert (m[M.HABIT_ACC_CONCISE], m[M.HABIT_ACC_LOOP], m[M.HABIT_ACC_VERBOSE]) == (0.5, 0.0, 1.0)
    # lengths by style and outcome: concise right 9 and 5, wrong 9 and 9; the loop wrong at 30; verbose right at 20
    assert (m[M.HABIT_LEN_RIGHT_CONCISE], m[M.HABIT_LEN_WRONG_CONCISE]) == (7.0, 9.0)
    assert (m[M.HABIT_LEN_WRONG_LOOP], m[M.HABIT_LEN_RIGHT_VERBOSE]) == (30.0, 20.0)
    assert M.HABIT_LEN_RIGHT_LOOP not in m and M.HABIT_LEN_WRONG_VERBOSE not in m  # no such responses
    assert set(m) <= set(M.all_training_metrics())


def test_the_habits_world_config_refuses_shares_above_one():
    from dapo.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="mix_long"):
        load_config(preset="tiny", overrides=["tiny.kind=habits", "tiny.mix_easy=0.6", "tiny.mix_long=0.5"])
    with pytest.raises(ConfigError, match="sft_loop"):
        load_config(preset="tiny", overrides=["tiny.kind=habits", "tiny.sft_verbose=0.9", "tiny.sft_loop=0.2"])
    with pytest.raises(ConfigError, match="sft_mix_easy .* = 1.1"):  # the unset sft_mix_fork is mix_fork's 0.2
        load_config(preset="tiny", overrides=["tiny.kind=habits", "tiny.sft_mix_easy=0.6", "tiny.sft_mix_long=0.3"])
    with pytest.raises(ConfigError, match="tiny.assay=clip_higher is a habits world's: set tiny.kind=habits"):
        load_config(preset="tiny", overrides=["tiny.assay=clip_higher"])  # the arithmetic world would ignore it


def test_the_presets_working_styles_sit_where_each_toggle_needs_them_against_the_cap():
    """The habits preset's supervised solutions, in the world's own tokens (the build's tokenizer corpus): verbose
    working fits the cap on all but long problems; on long ones it fits with four operations (inside the soft
    punishment's buffer), sometimes with five and never with six (overlong filtering and the soft punishment act on
    it); concise working always fits, short of the buffer, but slips more often on long problems than verbose working
    does (a reason to write longer there); a loop fits the cap on all but some long problems. Change the world's text
    and this says which design assumption broke before a 15-minute build does."""
    from dapo.config import load_config
    from dapo.tinyworld.build import SFT_BATCH, TOKENIZER_CORPUS, supervised_solutions, world_splits, world_tokenizer

    cfg = load_config(preset="tiny-habits")
    tiny = cfg.tiny.model_copy(update={"sft_steps": TOKENIZER_CORPUS // SFT_BATCH + 1})  # the build's first problems
    splits = world_splits(tiny)
    solutions = supervised_solutions(tiny, splits.sft)
    tokens = world_tokenizer(splits.sft, solutions)(solutions, add_special_tokens=False)["input_ids"]
    lengths: dict[tuple[str, str], list[int]] = {}
    right: dict[tuple[str, str], list[bool]] = {}
    for task, text, ids in zip(splits.sft, solutions, tokens, strict=True):
        style, kind = H.response_style(H.tag_response(task.text, text, False)), H.problem_kind(task.text)
        lengths.setdefault((style, kind if kind != H.LONG else f"long{task.n_ops}"), []).append(len(ids) + 1)  # + EOS
        right.setdefault((style, kind), []).append(text.endswith(f"Answer: {task.answer}"))
    cap, buffer = cfg.rollout.max_response_length, cfg.algorithm.overlong_buffer_len
    assert len(lengths) == 18  # 3 styles x (3 kinds + long with 4, 5, 6 operations) with supervised solutions
    over = {key: sum(x > cap for x in n) / len(n) for key, n in lengths.items()}
    for (style, kind), share in over.items():
        if style == H.CONCISE or not kind.startswith(H.LONG):  # verbose and looping long answers: checked below
            assert share == 0.0, (style, kind, max(lengths[style, kind]))
    assert over[H.VERBOSE, "long4"] == 0.0 and 0.0 < over[H.VERBOSE, "long5"] < 1.0 and over[H.VERBOSE, "long6"] == 1.0
    loops = [over[H.LOOP, f"long{n}"] for n in (4, 5, 6)]
    assert max(loops) < 0.3 and sum(loops) > 0, loops
    assert min(lengths[H.VERBOSE, "long4"]) > cap - buffer >= max(max(lengths[H.CONCISE, k]) for k in ("long6", H.CORE))
    accuracy = {key: sum(r) / len(r) for key, r in right.items()}
    assert accuracy[H.CONCISE, H.LONG] < accuracy[H.CONCISE, H.CORE] - 0.2 < accuracy[H.VERBOSE, H.LONG] - 0.2


ASSAY_MIX = H.Mix(easy=0.25, fork=0.6, long=0.0, unsolvable=0.15)


def test_the_habits_worlds_problems_solutions_and_tags_are_those_its_frozen_worlds_were_built_from():
    """The clip-higher assay's forks came after the habits world was frozen: its problems, supervised solutions and
    tags at the preset's settings are the same text as before them (digest taken on the commit before)."""
    import hashlib

    mix, sft_mix = H.Mix(0.35, 0.15, 0.35, 0.1), H.Mix(0.235, 0.235, 0.355, 0.0)
    sp = H.make_splits(0, mix, 4000, 30, 3000, sft_mix)
    h = H.Habits(0.45, 0.2, 0.35, 0.15, 0.12, verbose_slip=0.01, long_slip=0.5, combine=1.0)
    rng = random.Random("x")
    sols = ["\n".join(H.solution_lines(t, h, rng)[0]) for t in sp.sft]
    large = H.make_large_eval(0, mix, 640, set())
    text = "\n".join([t.text for t in sp.train + sp.eval + sp.sft + large] + sols)
    tags = [H.tag_response(t.text, s, False) for t, s in zip(sp.sft, sols, strict=True)]
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == "06b45b8f29269594"
    assert hashlib.sha256(repr(tags).encode()).hexdigest()[:16] == "fd1a67d29c6e382c"


def test_the_clip_assay_draws_four_forks_each_marked_by_its_own_operations_alone():
    sp = H.make_splits(5, ASSAY_MIX, 2000, 40, 10, assay=H.CLIP_HIGHER)
    seen = Counter()
    for t in sp.train:
        fork = H.fork_of(t.text)
        if fork is None:
            continue
        seen[fork.phrase] += 1
        ops = _ops(t)
        assert ops.count(fork.right) == 1 and fork.wrong not in ops, t.text  # the tag reads the fork's line alone
        assert H.problem_kind(t.text) == (H.FORK_CONTROL if fork is H.FORKS[H.CONTROL_FORK] else H.FORK)
        right = H.Habits(0.0, 0.0, 0.0, fork_right=1.0, slip=0.0, fork_right_control=1.0)
        lines = H.solution_lines(t, right, random.Random(0))[0]
        assert H.tag_response(t.text, "\n".join(lines), False) == (H.FORK_RIGHT,) and lines[-1] == f"Answer: {t.answer}"
    assert len(seen) == 4 and min(seen.values()) > 0.2 * sum(seen.values())  # each fork about a quarter


def test_the_supervised_data_writes_the_rare_forks_right_operation_rarely_and_the_controls_often():
    sp = H.make_splits(6, ASSAY_MIX, 10, 10, 6000, assay=H.CLIP_HIGHER)
    h = H.Habits(verbose=0.0, loop=0.0, loop_slip=0.0, fork_right=0.04, slip=0.0, fork_right_control=0.3)
    rng, right = random.Random(1), {H.FORK: [], H.FORK_CONTROL: []}
    for t in sp.sft:
        kind = H.problem_kind(t.text)
        if kind in right:
            lines = H.solution_lines(t, h, rng)[0]
            tags = H.tag_response(t.text, "\n".join(lines), False)
            assert (H.FORK_RIGHT in tags) == (lines[-1] == f"Answer: {t.answer}")  # the wrong operation is wrong
            right[kind].append(H.FORK_RIGHT in tags)
    rare, control = (sum(v) / len(v) for v in right.values())
    assert 0.025 < rare < 0.055 and 0.25 < control < 0.35
    m = H.Tagger().metrics(
        [GroupOutcome([True, False], [1, -1], [9, 9], [False, False], [[H.FORK_RIGHT], [H.FORK_WRONG]], H.FORK_CONTROL)]
    )
    assert m[M.HABIT_FORK_RIGHT_CONTROL] == 0.5 and M.HABIT_FORK_RIGHT not in m  # the control is its own unit


TOKEN_HABITS = H.Habits(0.0, loop=0.3, loop_slip=0.0, fork_right=0.15, slip=0.0, short_wrong=0.3, loop_continue=0.5)


def test_the_token_assay_writes_two_always_wrong_habits_whose_lengths_differ_on_core_problems_only():
    """Both wrong habits must be wrong whatever the numbers (an off-by-one carried through additions and
    subtractions), loops about three times right working's length on core problems, and as long as the short habit
    on control problems (where per-response averaging has no length to act on)."""
    sp = H.make_splits(7, H.Mix(0.0, 0.0, 0.0, 0.0), 1200, 10, 10, assay=H.TOKEN_LOSS)
    rng, words = random.Random(2), {}
    for t in sp.train:
        kind = H.problem_kind(t.text)
        assert len(t.steps) == 3 and {op for op, _ in _ops(t)} <= {"+", "-"}, t.text
        lines, style = H.solution_lines(t, TOKEN_HABITS, rng)
        tags = H.tag_response(t.text, "\n".join(lines), False)
        assert tags == {H.LOOP: (H.LOOP,), H.SHORT_WRONG: (H.SHORT_WRONG,), H.CONCISE: ()}[style]
        assert (lines[-1] == f"Answer: {t.answer}") == (style == H.CONCISE), (style, lines)
        blocks = sum(line.startswith(H.AGAIN) for line in lines)
        assert (1 <= blocks <= (H.MAX_BLOCKS if kind == H.CORE else 1)) if style == H.LOOP else blocks == 0
        words.setdefault((kind, style), []).append(len("\n".join(lines).split()))
    mean = {k: sum(v) / len(v) for k, v in words.items()}
    control_share = sum(len(v) for (k, _), v in words.items() if k == H.CORE_CONTROL) / len(sp.train)
    assert 0.2 < control_share < 0.3
    assert 2.6 < mean[H.CORE, H.LOOP] / mean[H.CORE, H.CONCISE] < 3.4  # 1 + 2 blocks on average (at most 4)
    assert abs(mean[H.CORE, H.SHORT_WRONG] - mean[H.CORE, H.CONCISE]) <= 1  # "so" opens it
    assert abs(mean[H.CORE_CONTROL, H.LOOP] - mean[H.CORE_CONTROL, H.SHORT_WRONG]) <= 0.5


def test_the_token_assay_logs_the_loop_odds_where_its_control_problems_are():
    core = GroupOutcome([False, False, False, True], [0] * 4, [90, 120, 30, 30], [False] * 4,
                        [[H.LOOP], [H.LOOP], [H.SHORT_WRONG], []], kind=H.CORE)  # fmt: skip
    control = GroupOutcome([False, True], [0, 1], [31, 30], [False] * 2, [[H.SHORT_WRONG], []], kind=H.CORE_CONTROL)
    m = H.Tagger().metrics([core, control])
    assert m[M.HABIT_LOOP_ODDS] == pytest.approx(math.log(2.5 / 1.5))
    assert m[M.HABIT_LOOP_ODDS_CONTROL] == pytest.approx(math.log(0.5 / 1.5))
    assert (m[M.HABIT_LOOP_LENGTH], m[M.HABIT_SHORT_WRONG]) == (105.0, 2 / 6)
    assert M.HABIT_LOOP_ODDS not in H.Tagger().metrics([core])  # the habits world: no such unit, no such metric


def test_the_overlong_assay_hides_each_sums_length_in_its_digits_and_the_cap_cuts_careful_working_off_on_some():
    """Running sums whose careful working (a digit a line) the cap (RUN_CAP) cuts off on 30-45% of them, by their
    digits alone (every prompt is 20 digits); careful working is right; concise working (three digits, then two a
    line, the limit checked at a line's end) always fits and is right when it stops on the digit that passes the
    limit, about half the time; the control problems' careful working always fits; `careful_tokens` counts what the
    world's tokenizer makes of it."""
    from dapo.data.prompts import apply_dapo_template
    from dapo.tinyworld.tokenizer import train_tokenizer

    sp = H.make_splits(7, H.Mix(0.0, 0.0, 0.0, 0.0), 1000, 10, 10, assay=H.OVERLONG)
    careful, concise = H.Habits(0.0, 0.0, 0.0, 0.0, 0.0, careful=1.0), H.Habits(0.0, 0.0, 0.0, 0.0, 0.0, careful=0.0)
    rng = random.Random(3)
    worked = [(t, H.solution_lines(t, careful, rng), H.solution_lines(t, concise, rng)) for t in sp.train]
    corpus = [f"user\n{apply_dapo_template(t.text)}" for t in sp.train[:300]]
    tok = train_tokenizer(corpus + ["assistant\n" + "\n".join(c[0]) for _, c, _ in worked[:300]], 512)
    kinds = Counter(H.problem_kind(t.text) for t in sp.train)
    assert set(kinds) == {H.RUN_FITS, H.RUN_OVERRUNS, H.RUN_CONTROL}
    assert 0.2 < kinds[H.RUN_CONTROL] / len(sp.train) < 0.3
    assert 0.3 < kinds[H.RUN_OVERRUNS] / (kinds[H.RUN_OVERRUNS] + kinds[H.RUN_FITS]) < 0.45
    concise_right = []
    for i, (t, (c_lines, c_style), (s_lines, s_style)) in enumerate(worked):
        kind, digits = H.problem_kind(t.text), [t.start, *(s.b for s in t.steps)]
        assert (c_style, s_style) == (H.CAREFUL, H.CONCISE)
        limit = int(t.text.split("more than ")[1].split(".")[0])
        for lines in (c_lines, s_lines):  # each stops at the first line whose total passes the limit
            sums = [int(line.rsplit(" = ", 1)[1]) for line in lines[:-1]]
            assert sums[-1] > limit and all(s <= limit for s in sums[:-1]) and lines[-1] == f"Answer: {sums[-1]}"
        assert c_lines[-1] == f"Answer: {t.answer}" and all(line.count("+") == 2 for line in s_lines[:-2])
        if kind != H.RUN_CONTROL:  # (a control's eighth digit can end a line alone: there is no ninth)
            concise_right.append(s_lines[-1] == c_lines[-1])
            assert concise_right[-1] == (len(digits) % 2 == 1)  # three digits, then two a line: an odd count ends one
        assert H.tag_response(t.text, "\n".join(c_lines), False) == (H.CAREFUL,)
        assert H.tag_response(t.text, "\n".join(s_lines), False) == ()
        if i < 200:  # the tokens as the world's tokenizer spells them (+1: the end of the turn)
            assert H.careful_tokens(digits) == len(tok("\n".join(c_lines))["input_ids"]) + 1
            assert len(tok("\n".join(s_lines))["input_ids"]) + 1 <= H.RUN_CAP, s_lines
            assert len(tok(apply_dapo_template(t.text))["input_ids"]) <= 110  # the template's prompts keep under 128
        assert (H.careful_tokens(digits) > H.RUN_CAP) == (kind == H.RUN_OVERRUNS)
    assert H.response_style((H.CAREFUL,)) == H.CAREFUL and H.response_style(()) == H.CONCISE
    assert 0.45 < sum(concise_right) / len(concise_right) < 0.6


def test_the_overlong_assay_logs_the_careful_share_its_cut_off_share_and_margin_where_its_control_problems_are():
    fits = GroupOutcome([True, False, True, False], [0] * 4, [150, 192, 90, 90], [False, True, False, False],
                        [[H.CAREFUL], [H.CAREFUL], [], []], kind=H.RUN_FITS)  # fmt: skip
    over = GroupOutcome([False, True], [0] * 2, [192, 100], [True, False], [[H.CAREFUL], []], kind=H.RUN_OVERRUNS)
    control = GroupOutcome([True, True], [1, 1], [40, 30], [False] * 2, [[H.CAREFUL], []], kind=H.RUN_CONTROL)
    m = H.Tagger().metrics([fits, over, control])
    assert (m[M.HABIT_CAREFUL], m[M.HABIT_CAREFUL_CONTROL], m[M.HABIT_CAREFUL_TRUNCATED]) == (0.5, 0.5, 2 / 3)
    assert m[M.HABIT_CAREFUL_MARGIN] == pytest.approx(1 / 3 - 2 / 3)  # a cut-off response counts as wrong
    assert (m[M.HABIT_ACC_RUN_FITS], m[M.HABIT_ACC_RUN_OVERRUNS], m[M.HABIT_ACC_RUN_CONTROL]) == (0.5, 0.5, 1.0)
    assert M.HABIT_CAREFUL not in H.Tagger().metrics([fits])  # no control problems: not the assay's world
