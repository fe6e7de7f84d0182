"""compute-sanitizer output -> per-step rows and tables (bench/sanitize/report.py), on CPU; and the
run pool's one restart of a run that hangs (bench/sanitize/sanitizer.py).

The fixtures are in compute-sanitizer's format (`========= ` headlines, indented details, the closing
summary) interleaved with the driver's ROSETTA-STEP markers, as `make sanitize` logs them."""
import csv
import os
import time
from pathlib import Path

from rosetta.bench.sanitize import report

FIXTURES = Path(__file__).parent / "fixtures"
VECTOR_ADD_CUDA = tuple((f"vector_add/cuda/{s}", "forward")
                        for s in ("01_naive", "02_grid_stride", "03_vectorized", "04_unrolled_blocks"))

# racecheck in its default analysis mode: one report per racing pair, an error and a warning
RACECHECK = """\
========= COMPUTE-SANITIZER
ROSETTA-INPUTS reduce_sum/cuda/05_unroll_last_warp forward float32 1025
ROSETTA-STEP reduce_sum/cuda/05_unroll_last_warp forward float32 1025
========= Error: Race reported between Write access at void (anonymous namespace)::reduce_unroll_last_warp<float>(const T1 *, float *, long)+0x2a0 in 05_unroll_last_warp.cu:38
=========     and Read access at void (anonymous namespace)::reduce_unroll_last_warp<float>(const T1 *, float *, long)+0x280 in 05_unroll_last_warp.cu:38 [992 hazards]
=========
========= Warning: Race reported between Read access at void (anonymous namespace)::reduce_unroll_last_warp<float>(const T1 *, float *, long)+0x300 in 05_unroll_last_warp.cu:40
=========     and Write access at void (anonymous namespace)::reduce_unroll_last_warp<float>(const T1 *, float *, long)+0x2a0 in 05_unroll_last_warp.cu:38 [32 hazards]
=========
ROSETTA-INPUTS reduce_sum/cuda/06_full_unroll forward float32 1025
ROSETTA-STEP reduce_sum/cuda/06_full_unroll forward float32 1025
ROSETTA-DONE
========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)
"""


def by_step(run):
    return {r.step: r for r in run.rows}


def test_clean_run_has_every_case_and_no_errors():
    run = report.parse((FIXTURES / "sanitize_clean.txt").read_text(), "memcheck", "vector_add", "triton")
    assert run.status == "ok" and run.reported == 0
    rows = by_step(run)
    assert set(rows) == {"vector_add/triton/01_block", "vector_add/triton/02_autotuned"}
    assert all(r.errors == 0 and r.status == "ok" and r.cases == 6 for r in rows.values())  # 3 dtypes x 2 shapes


def test_planted_error_goes_to_the_step_whose_marker_precedes_it():
    text = (FIXTURES / "sanitize_planted.txt").read_text()
    run = report.parse(text, "memcheck", "vector_add", "cuda", expected=VECTOR_ADD_CUDA)
    rows = by_step(run)
    assert run.status == "ok" and run.reported == 1
    assert [r.step for r in run.rows] == [s for s, _ in VECTOR_ADD_CUDA]  # no (setup) row: it is clean
    bad = rows["vector_add/cuda/03_vectorized"]
    assert (bad.errors, bad.status, bad.cases) == (1, "errors", 3)
    assert bad.first.startswith("Invalid __global__ read of size 4 bytes at void (anonymous namespace)")
    assert bad.first.endswith("[float32 1]")  # the case it happened in
    assert all(rows[s].errors == 0 and rows[s].status == "ok" for s, _ in VECTOR_ADD_CUDA if "03" not in s)


def test_racecheck_errors_and_warnings():
    run = report.parse(RACECHECK, "racecheck", "reduce_sum", "cuda")
    rows = by_step(run)
    race = rows["reduce_sum/cuda/05_unroll_last_warp"]
    assert (race.errors, race.warnings, race.status) == (1, 1, "errors")
    assert race.first.startswith("Error: Race reported between Write access")
    assert rows["reduce_sum/cuda/06_full_unroll"].errors == 0
    assert run.reported == 2 and "2 hazards displayed (1 error, 1 warning)" in run.summary


def test_wrapped_racecheck_summary_is_read():
    text = RACECHECK.replace("2 hazards displayed (1 error, 1 warning)",
                             "2 hazards displayed\n========= (1 error, 1 warning)")
    assert report.parse(text, "racecheck", "reduce_sum", "cuda").reported == 2


def test_setup_api_errors_and_unprinted_errors_get_their_own_rows():
    text = ("========= COMPUTE-SANITIZER\n"
            '========= Program hit CUDA_ERROR_INVALID_VALUE (error 1) due to "invalid argument" on CUDA API'
            " call to cuGetProcAddress_v2.\n"
            "=========     Saved host backtrace up to driver entry point at error\n"
            "ROSETTA-STEP vector_add/cuda/01_naive forward float32 1\n"
            "ROSETTA-DONE\n========= ERROR SUMMARY: 60 errors\n")
    rows = by_step(report.parse(text, "memcheck", "vector_add", "cuda"))
    setup = rows["vector_add/cuda/(setup)"]
    assert (setup.api_errors, setup.errors) == (1, 0) and "cuGetProcAddress" in setup.first_api and not setup.first
    assert rows["vector_add/cuda/(unattributed)"].errors == 59  # past --print-limit
    assert rows["vector_add/cuda/01_naive"].errors == 0


def test_steps_after_the_print_limit_are_unknown_not_clean():
    block = "========= Invalid __global__ write of size 4 bytes\n=========     at k+0x10 in a.cu:3\n"
    text = ("ROSETTA-STEP vector_add/cuda/01_naive forward float32 1\n" + block * 2 +
            "ROSETTA-STEP vector_add/cuda/02_grid_stride forward float32 1\n"
            "ROSETTA-DONE\n========= ERROR SUMMARY: 5 errors\n")
    rows = by_step(report.parse(text, "memcheck", "vector_add", "cuda"))
    assert rows["vector_add/cuda/01_naive"].errors == 2
    assert rows["vector_add/cuda/(unattributed)"].errors == 3
    assert rows["vector_add/cuda/02_grid_stride"].status == "unknown (print limit)"


def test_a_crashed_run_is_a_failure_and_later_steps_are_not_run():
    text = (FIXTURES / "sanitize_planted.txt").read_text().split("ROSETTA-INPUTS vector_add/cuda/04")[0]
    text += "RuntimeError: CUDA error: unspecified launch failure\n"
    run = report.parse(text, "memcheck", "vector_add", "cuda", returncode=1, expected=VECTOR_ADD_CUDA)
    rows = by_step(run)
    assert run.status == "crashed (exit 1)"
    assert rows["vector_add/cuda/(process)"].status == "crashed (exit 1)"
    assert "unspecified launch failure" in rows["vector_add/cuda/(process)"].first
    assert rows["vector_add/cuda/04_unrolled_blocks"].status == "not run"
    timed = report.parse(text, "memcheck", "vector_add", "cuda", returncode=-9, timed_out=True)
    assert timed.status == "timed out"


def test_exceptions_and_declared_limits():
    text = ("ROSETTA-STEP softmax/cuda/01_naive forward float32 3x262151\n"
            "ROSETTA-SKIP softmax/cuda/01_naive forward float32 3x262151 takes cols <= 16384\n"
            "ROSETTA-STEP softmax/cuda/02_x backward float16 7x3000\n"
            "ROSETTA-EXCEPTION softmax/cuda/02_x backward float16 7x3000 RuntimeError: bad launch\n"
            "ROSETTA-DONE\n========= ERROR SUMMARY: 0 errors\n")
    run = report.parse(text, "memcheck", "softmax", "cuda")
    rows = {(r.step, r.direction): r for r in run.rows}
    assert rows[("softmax/cuda/01_naive", "forward")].skipped == 1
    failed = rows[("softmax/cuda/02_x", "backward")]
    assert failed.status == "exception" and "RuntimeError: bad launch [float16 7x3000]" == failed.first


def test_markdown_table_and_csv(tmp_path):
    planted = report.parse((FIXTURES / "sanitize_planted.txt").read_text(), "memcheck", "vector_add", "cuda",
                           expected=VECTOR_ADD_CUDA)
    racecheck = report.parse(RACECHECK.replace("reduce_sum", "vector_add").replace("05_unroll_last_warp", "01_naive"),
                             "racecheck", "vector_add", "cuda", expected=VECTOR_ADD_CUDA)
    clean = report.parse((FIXTURES / "sanitize_clean.txt").read_text(), "memcheck", "vector_add", "triton")
    runs = [planted, racecheck, clean]
    text = report.markdown(runs, ("memcheck", "racecheck"), commands=["compute-sanitizer --tool memcheck ..."],
                           date="2025-01-01 00:00:00 UTC", gpu="NVIDIA H100 80GB HBM3")
    lines = text.splitlines()
    assert "| step | direction | memcheck | racecheck |" in lines
    assert "| vector_add/cuda/01_naive | forward | 0 | 1 (+1 warn) |" in lines
    assert "| vector_add/cuda/03_vectorized | forward | 1 | not run |" in lines  # racecheck never reached it
    assert "| vector_add/triton/01_block | forward | 0 | - |" in lines  # 0 shown as 0; '-': not run there
    step_rows = [line for line in lines if line.startswith("| vector_add/")]
    assert step_rows[0].startswith("| vector_add/cuda/01") and step_rows[-1].startswith("| vector_add/triton/02")
    assert any("Invalid __global__ read of size 4 bytes" in line for line in lines)
    assert "**Total: 2 device errors, 1 race warnings, 0 API errors; 0 of 3 sanitizer runs failed.**" in lines
    assert "compute-sanitizer --tool memcheck ..." in lines and "2025-01-01" in text

    report.write_csv(runs, tmp_path / "sanitize.csv")
    rows = list(csv.DictReader(open(tmp_path / "sanitize.csv")))
    assert tuple(rows[0]) == report.CSV_FIELDS
    bad = [r for r in rows if r["errors"] != "0"]
    assert [(r["tool"], r["step"]) for r in bad] == [("memcheck", "vector_add/cuda/03_vectorized"),
                                                     ("racecheck", "vector_add/cuda/01_naive")]


    # read back as runs (what a run over some ops merges into): the same rows, errors and statuses
    again = report.read_csv(tmp_path / "sanitize.csv")
    assert [(r.tool, r.op, r.backend) for r in again] == [(r.tool, r.op, r.backend) for r in runs]
    assert [r.rows for r in again] == [r.rows for r in runs]
    assert report.read_csv(tmp_path / "absent.csv") == []


def test_a_run_that_hangs_is_started_once_more(tmp_path):
    """The first start sleeps past its limit (a hung sanitizer); the second finishes: the result is
    the second's, marked restarted, and the first log is kept beside it."""
    from rosetta.bench.sanitize.sanitizer import run_all

    marker = tmp_path / "started"
    script = f"if [ -e {marker} ]; then echo second; else touch {marker}; echo first; sleep 30; fi"
    log = tmp_path / "run.log"
    done = []
    run_all({"memcheck softmax cuda": (["sh", "-c", script], log, True)}, jobs=2, limit=1.0,
            deadline=time.monotonic() + 120, env=dict(os.environ), on_done=lambda name, r: done.append((name, r)))
    [(name, result)] = done
    assert name == "memcheck softmax cuda" and result.returncode == 0 and result.restarted and not result.timed_out
    assert "second" in log.read_text() and "first" in (tmp_path / "run.log.timed-out").read_text()
    again = [name]
    note = report.restart_note(again, 120)
    assert "memcheck softmax cuda" in note[0] and report.restart_note([], 120) == []
    assert report.restarts("\n".join(["**Total: ...**", *note])) == 1 and report.restarts("no note") == 0


def test_a_probe_marks_the_rows_it_explains(tmp_path):
    """A probe's `Explains:` line marks matching rows (tool, step pattern, direction) as the tool's
    limit: their counts stay, the cell names the probe, the total counts them apart."""
    (tmp_path / "probe.cu").write_text("// Racecheck probe: a question\n// Explains: racecheck vector_add/cuda/01_* forward\n")
    limits = report.known_limits(tmp_path)
    assert limits == [report.Limit("racecheck", "vector_add/cuda/01_*", "forward", "probe.cu", "Racecheck probe: a question")]
    race = report.Row("racecheck", "vector_add", "cuda", "vector_add/cuda/01_naive", "forward", errors=3)
    assert report.explained_by(race, limits) == limits[0]
    assert report.explained_by(report.Row("memcheck", "vector_add", "cuda", race.step, "forward", errors=3), limits) is None
    assert report.explained_by(report.Row("racecheck", "vector_add", "cuda", race.step, "backward", errors=3), limits) is None
    assert report.explained_by(report.Row("racecheck", "vector_add", "cuda", race.step, "forward"), limits) is None


def test_rerender_keeps_the_runs_data_and_is_idempotent(tmp_path):
    """make docs re-renders sanitize.md from sanitize.csv; what only the run knew (date, GPU, notes,
    commands, sanitizer summaries, the logs line) is read back from the file."""
    racecheck = report.parse(RACECHECK, "racecheck", "reduce_sum", "cuda")
    md, csv_path = tmp_path / "sanitize.md", tmp_path / "sanitize.csv"
    text = report.markdown([racecheck], ("racecheck",), commands=["compute-sanitizer --tool racecheck ..."],
                           date="2025-01-01 00:00:00 UTC", gpu="NVIDIA H100 80GB HBM3", notes=["a note"])
    md.write_text(text + "\nLogs: somewhere.\n")
    report.write_csv([racecheck], csv_path)
    assert report.rerender(md, csv_path, ("memcheck", "racecheck")) is False  # nothing to change
    assert md.read_text() == text + "\nLogs: somewhere.\n"
    assert racecheck.summary.startswith("RACECHECK SUMMARY") and racecheck.summary in md.read_text()


def test_a_run_that_did_not_start_keeps_the_earlier_result():
    def run(tool, op, status="ok"):
        return report.Run(tool, op, "triton", rows=[report.Row(tool, op, "triton", f"{op}/triton/01", status=status)],
                          status=status)
    earlier = [run("memcheck", "rms_norm"), run("memcheck", "layer_norm"), run("memcheck", "softmax")]
    now = [run("memcheck", "rms_norm", report.NOT_STARTED), run("memcheck", "layer_norm", "errors"),
           run("memcheck", "dropout", report.NOT_STARTED)]
    merged, kept, carried = report.merge_with_earlier(now, earlier)
    by_op = {r.op: r for r in merged}
    assert by_op["rms_norm"] is earlier[0]  # not started: the earlier result stands
    assert by_op["layer_norm"].status == "errors"  # this run's result replaces the earlier one
    assert by_op["softmax"] is earlier[2]  # not selected: kept
    assert by_op["dropout"].status == report.NOT_STARTED  # nothing earlier to keep: reported as it is
    assert (len(merged), kept, carried) == (4, 1, 1)
