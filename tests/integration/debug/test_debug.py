"""A post-mortem on the rank that failed, in a real kernel on real engines: ``%nbdist debug``'s
pdb prompts are answered through the kernel's stdin channel, as a notebook's input box answers
them; each command runs on the failed rank's engine, in its frame."""

from __future__ import annotations

import pytest

FAILING = """%%distributed
def inner(d):
    secret = 41 + nbdist.rank()
    return d["b"]

def outer():
    table = {"a": 1}
    return inner(table)

if nbdist.rank() == 1:
    outer()
"""


def _interactive(kernel, code: str, answers: list[str], timeout: float = 120):
    """Run ``code``, answering each input request with the next answer ("q" once they run out);
    what the cell printed, the prompts it showed, and its error (None if none)."""
    printed, prompts, errors = [], [], []
    answers = iter(answers)

    def stdin_hook(msg):
        prompts.append(msg["content"]["prompt"])
        kernel.kc.input(next(answers, "q"))

    def output_hook(msg):
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            errors.append(f"{msg['content']['ename']}: {msg['content']['evalue']}")

    kernel.kc.execute_interactive(
        code, timeout=timeout, allow_stdin=True, stdin_hook=stdin_hook, output_hook=output_hook
    )
    return "".join(printed), prompts, errors[0] if errors else None


def test_pdb_on_the_failed_rank_runs_there_in_its_frames(ready):
    res = ready.run(FAILING)
    assert res.error is not None and "KeyError" in res.error["evalue"]
    answers = ["p secret", "p d", "l", "u", "p table", "w", "n", "p nbdist.rank()", "q"]
    printed, prompts, error = _interactive(ready, "%nbdist debug", answers)
    assert error is None, error
    assert prompts == ["(Pdb rank 1) "] * len(answers)
    assert printed.startswith("nbdist: post-mortem of rank 1 (KeyError: 'b')")
    assert '-> return d["b"]' in printed  # it opens at the line that raised
    assert "42\n" in printed and "{'a': 1}\n" in printed  # rank 1's values, not rank 0's
    # w lists the person's frames only: no nbdist, IPython or exec frames around them
    where = printed.split("{'a': 1}\n", 1)[1]
    assert "inner()" in where and "outer()" in where and "runner.py" not in where
    assert "nothing left to run" in printed  # n: a post-mortem resumes nothing
    assert printed.rstrip().endswith("1")  # p nbdist.rank(): evaluated on rank 1's engine
    # the engine and its variables stay; the next cell runs as any other
    assert ready.ok("%%distributed\nnbdist.rank() + 10").result == "10"


def test_post_mortem_returns_the_frames_as_data(ready):
    ready.run(FAILING)
    res = ready.ok(
        "import nbdist\npm = nbdist.post_mortem()\n"
        "print(pm.rank, pm.summary, [f.function for f in pm.frames], dict(pm.frames[-1].locals))"
    )
    assert res.stdout.strip() == (
        "1 KeyError: 'b' ['<module>', 'outer', 'inner'] {'d': \"{'a': 1}\", 'secret': '42'}"
    )


@pytest.mark.parametrize(
    "line, message",
    [
        ("%nbdist debug --rank 7", "--rank 7: the cluster has ranks 0 to 1"),
        ("%nbdist debug --rank 0", "rank 0 did not fail in the last cell (rank 1 did)"),
    ],
)
def test_bad_input_is_one_line(ready, line, message):
    ready.run(FAILING)
    res = ready.run(line)
    assert res.error is not None and res.error["ename"] == "UsageError"
    assert message in res.error["evalue"] and len(res.error["traceback"]) == 1


def test_nothing_to_debug_says_why(ready):
    ready.ok("%%distributed\nx = 1")
    res = ready.run("%nbdist debug")
    assert res.error["evalue"] == "nothing to debug: the last %%distributed cell did not fail"


def test_a_rank_whose_engine_died_has_nothing_left_to_debug(ready):
    res = ready.run("%%distributed\nimport os\nif nbdist.rank() == 1:\n    os._exit(3)\n")
    assert res.error is not None
    res = ready.run("%nbdist debug")
    assert res.error["ename"] == "UsageError"
    assert res.error["evalue"].startswith("rank 1's engine was lost (")
    assert res.error["evalue"].endswith("): its frames went with it")
