"""Every .cu compiles with plain nvcc for sm_90a (the flags torch's build uses) and spills nothing."""
import fnmatch
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import rosetta
from rosetta import cuda_build, cuda_codegen

CU_FILES = sorted(cuda_build.CUDA_DIR.rglob("*.cu"))
NVCC = shutil.which("nvcc")
STEPS = {cuda_build.REPO / v.source: v for v in rosetta.variants(backend="cuda")}
MANGLED = {"float16": "6__half", "bfloat16": "13__nv_bfloat16"}  # how a kernel's name shows T


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """rosetta_ops.h (the per-op argument structs) as the build generates it."""
    folder = tmp_path_factory.mktemp("generated")
    cuda_build.write_generated(folder)
    return folder


def compile_cu(path, out_dir, generated):
    """nvcc as the extension build runs it: through a shim that sets the step's declared dtypes
    (nvcc would split a -D value at its commas)."""
    cubin = out_dir / (path.stem + ".cubin")
    shim = out_dir / f"{path.parent.name}__{path.name}"
    shim.write_text(cuda_build.shim_text(path, STEPS.get(path)))
    cmd = [NVCC, "-cubin", *cuda_build.NVCC_FLAGS, cuda_build.HOPPER_GENCODE,
           *cuda_build.TORCH_NVCC_DEFINES, f"-I{cuda_build.COMMON_DIR}", f"-I{generated}",
           "-Xptxas", "-v", str(shim), "-o", str(cubin)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"nvcc failed on {path}:\n{result.stderr}"
    return cubin, result.stderr


@pytest.fixture(scope="module")
def compiled(tmp_path_factory, generated):
    """compile_cu once per file for the module: the SASS claims reuse the spill test's cubins."""
    cache = {}

    def get(path):
        if path not in cache:
            cache[path] = compile_cu(path, tmp_path_factory.mktemp(path.stem), generated)
        return cache[path]
    return get


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("path", CU_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_compiles_without_spills(compiled, path):
    _, report = compiled(path)
    kernels = re.findall(r"Compiling entry function '(\w+)'", report)
    assert kernels, f"{path}: ptxas reported no kernels:\n{report}"
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert spills and all(s == ("0", "0") for s in spills), f"{path} spills registers:\n{report}"
    undeclared = [t for t, m in MANGLED.items() if path in STEPS
                  and t not in {str(d).removeprefix("torch.") for d in STEPS[path].dtypes}
                  and any(m in k for k in kernels)]
    assert not undeclared, f"{path} instantiates {undeclared}, which its Dtypes line does not declare"


def test_generated_binding_covers_every_cuda_launcher():
    text = cuda_codegen.binding_include()
    for v in rosetta.variants(backend="cuda"):
        assert f'm.def("{v.qualname}_out", &{v.qualname}_out);' in text
        assert f'm.def("{v.qualname}_new", &{v.qualname}_new);' in text  # the public call's eager path
        assert f"cudaError_t {v.launcher_name}(const rosetta::" in text
    assert "struct SoftmaxBackwardArgs { Tensor y; Tensor dy; Tensor dx; Workspace workspace; };" in \
        cuda_codegen.ops_header()
    # several outputs come back as one tuple, each allocated from its template
    assert ("std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_cuda_01_two_pass_new(const at::Tensor& y_like, "
            "const at::Tensor& mean_like, const at::Tensor& rstd_like, const at::Tensor& y_view, "
            "const at::Tensor& mean_view, const at::Tensor& rstd_view, const at::Tensor& x, "
            "const at::Tensor& weight, const at::Tensor& bias, double eps) {") in text


def _cuobjdump():
    """The triton wheel ships cuobjdump (CI has nvcc but no CUDA toolkit binaries beside it)."""
    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if bundled.exists() else shutil.which("cuobjdump")


CUOBJDUMP = _cuobjdump()


def sass_opcodes(cubin, kernel_substring):
    """The opcode sequence of the first kernel whose mangled name contains kernel_substring (`*`
    matches anything: "I13__nv_bfloat16*BiasGelu"), shapes included (HGMMA.64x256x16.F32.BF16). Only that kernel is disassembled: softmax step 5's cubin holds ~100."""
    symbols = subprocess.run([CUOBJDUMP, "--dump-elf-symbols", str(cubin)], capture_output=True, text=True).stdout
    names = [line.split()[-1] for line in symbols.splitlines() if "STO_ENTRY" in line]
    name = next((n for n in names if fnmatch.fnmatchcase(n, f"*{kernel_substring}*")), None)
    if name is None:
        return []
    dump = subprocess.run([CUOBJDUMP, "--dump-sass", "--function", name, str(cubin)],
                          capture_output=True, text=True).stdout
    return re.findall(r"\*/[ \t]+(?:@!?U?P\w+[ \t]+)?([A-Z][A-Za-z0-9_.]+)", dump)


# Steps whose header claims an instruction pattern: (file, kernel, what must appear in the SASS).
SASS_CLAIMS = [
    # "issues all eight LDG.E.128 before the first FADD" (fp32 instantiation)
    ("reduce_sum/10_deep_loads.cu", "IfE", lambda ops: "LDG.E.128 " * 8 in " ".join(
        o for o in ops if o.startswith(("LDG", "FADD"))) + " "),
    # 128-bit loads and stores
    ("vector_add/03_vectorized.cu", "IfE", lambda ops: "LDG.E.128.CONSTANT" in ops and "STG.E.128" in ops),
    ("vector_add/04_unrolled_blocks.cu", "IfE", lambda ops: ops.count("LDG.E.128.CONSTANT") >= 8),
    # the shuffle tree
    ("reduce_sum/08_warp_shuffle.cu", "IfE", lambda ops: "SHFL.DOWN" in ops),
    # "2 LDG.128 per tile and 4 LDS.128 per 64 FFMA (16 FFMA per shared load)" (the aligned path)
    ("matmul/06_vectorized.cu", "ILb1ELb1E", lambda ops: ops.count("LDG.E.128") == 2
     and ops.count("FFMA") == 16 * ops.count("LDS.128") > 0),
    # "copies go through cp.async ... a ... 4-byte copies ... b moves in 16-byte copies ... zero-filled"
    ("matmul/08_pipelined.cu", "matmul_pipelined", lambda ops: {"LDGSTS.E", "LDGSTS.E.BYPASS.128.ZFILL"} <= set(ops)),
    # "the multiply-adds move from FFMA to the tensor cores ... wmma::mma_sync (HMMA in SASS)"
    ("matmul/09_wmma.cu", "I13__nv_bfloat16E", lambda ops: "HMMA.16816.F32.BF16" in ops and "FFMA" not in ops),
    # "8 LDSM.x4 ... for 32 HMMA.16816" per k16 slice, filled by "Step 8's cp.async ring (zero-fill)"
    ("matmul/10_mma_sync.cu", "I13__nv_bfloat16E", lambda ops: "LDGSTS.E.BYPASS.128.ZFILL" in ops
     and ops.count("HMMA.16816.F32.BF16") == 4 * sum(o.startswith("LDSM.16.") and o.endswith(".4") for o in ops) > 0),
    # "cp.async.bulk.tensor.2d, UTMALDG ... wgmma.m64n128k16 (HGMMA)"
    ("matmul/11_wgmma_tma.cu", "I13__nv_bfloat16Lb0ELb0E",
     lambda ops: {"UTMALDG.2D", "HGMMA.64x128x16.F32.BF16"} <= set(ops)),
    # "each consumer m64n256k16 ... setmaxnreg moves registers from the producer (down to 40) to the consumers"
    ("matmul/12_warp_specialized.cu", "I13__nv_bfloat16Lb0ELb0E", lambda ops: {
        "UTMALDG.2D", "HGMMA.64x256x16.F32.BF16", "USETMAXREG.DEALLOC.CTAPOOL", "USETMAXREG.TRY_ALLOC.CTAPOOL"} <= set(ops)),
    # "multicasts it to both (cp.async.bulk.tensor .multicast::cluster) ... (cp.async.bulk.tensor store, UTMASTG)"
    ("matmul/13_persistent_clusters.cu", "I13__nv_bfloat16Li128ELi256ELb0ELb0E", lambda ops: {
        "UTMALDG.2D.MULTICAST", "UTMASTG.2D", "HGMMA.64x256x16.F32.BF16", "USETMAXREG.DEALLOC.CTAPOOL",
        "USETMAXREG.TRY_ALLOC.CTAPOOL"} <= set(ops)),
    # "The tile is ... 192 x 192 (three consumer warpgroups, 3 stages)": each an m64n192k16
    ("matmul/13_persistent_clusters.cu", "I13__nv_bfloat16Li192ELi192ELb0ELb0E", lambda ops: {
        "UTMALDG.2D.MULTICAST", "UTMASTG.2D", "HGMMA.64x192x16.F32.BF16"} <= set(ops)),
    # "one consumer warpgroup, wgmma.m64n128k16, HGMMA.64x128x16" fed by TMA, and "programmatic dependent
    # launch (griddepcontrol)": the GEMM's launch_dependents (PREEXIT), the reduction's wait (ACQBULK)
    ("matmul/14_split_k.cu", "matmul_split_kI13__nv_bfloat16Li1ELi128ELb0ELb0E", lambda ops: {
        "UTMALDG.2D", "HGMMA.64x128x16.F32.BF16", "PREEXIT"} <= set(ops)),
    # "64-column tiles (wgmma.m64n64k16 ...), no split"
    ("matmul/14_split_k.cu", "matmul_split_kI13__nv_bfloat16Li1ELi64ELb0ELb0E", lambda ops: {
        "UTMALDG.2D", "HGMMA.64x64x16.F32.BF16"} <= set(ops)),
    ("matmul/14_split_k.cu", "sum_slicesI13__nv_bfloat16E",
     lambda ops: {"ACQBULK", "LDG.E.128.CONSTANT", "STG.E.64"} <= set(ops)),
    # stream-K: "wgmma ... fed by TMA", a ticket per shared tile (an atomic add), and slots read back
    # from L2 ("never a stale L1 line")
    ("matmul/17_stream_k.cu", "matmul_stream_kI13__nv_bfloat16Li2ELb0ELb0E", lambda ops: {
        "UTMALDG.2D", "HGMMA.64x128x16.F32.BF16", "ATOMG.E.ADD.STRONG.GPU", "LDG.E.64.STRONG.GPU"} <= set(ops)),
    # the slices meet "through DSMEM (mapa + ld.shared::cluster)" between two cluster barriers
    ("matmul/18_split_k_cluster.cu", "matmul_split_k_clusterI13__nv_bfloat16Li2ELb0ELb0E", lambda ops: {
        "UTMALDG.2D", "HGMMA.64x128x16.F32.BF16", "UCGABAR_ARV", "UCGABAR_WAIT"} <= set(ops)
     and ops.count("LD.E.64") == 8),
    # linear_gelu step 2: "bias + GELU on the fp32 accumulators, before the only store" (bf16: GELU's
    # hardware tanh on the MUFU pipe, inside the wgmma kernel that stores by TMA)
    ("linear_gelu/02_fused_epilogue.cu", "I13__nv_bfloat16*BiasGelu", lambda ops: {"MUFU.TANH", "UTMASTG.2D"} <= set(ops)
     and any(o.startswith("HGMMA.64x") for o in ops)),
    # linear_gelu step 3: "each owns a whole 128 x 128 tile (two m64n128 row blocks)", "B multicast
    # across the 2-CTA cluster as before", step 2's GELU (MUFU.TANH) and TMA stores
    ("linear_gelu/03_pingpong_consumers.cu", "gemm_pingpongI13__nv_bfloat16Lb0ELb0E*BiasGelu", lambda ops: {
        "HGMMA.64x128x16.F32.BF16", "UTMALDG.2D.MULTICAST", "UTMASTG.2D", "MUFU.TANH", "USETMAXREG.DEALLOC.CTAPOOL",
        "USETMAXREG.TRY_ALLOC.CTAPOOL"} <= set(ops) and not any(o.startswith("HGMMA.64x256") for o in ops)),
    # rms_norm step 3, a row across a cluster of 4: "each warp's lane r st.async's the warp's partial
    # into CTA r's ... wait on its own" (barrier.cluster's MEMBAR.ALL.GPU avoided)
    ("rms_norm/03_pipelined_rows.cu", "rms_norm_rowsI13__nv_bfloat16Li512ELi16ELi4ELb1E", lambda ops: {
        "STAS.64", "SYNCS.PHASECHK.TRANS64.TRYWAIT", "LDG.E.128.CONSTANT", "STG.E.128"} <= set(ops)
     and not any(o.startswith("MEMBAR") for o in ops)),
    # attention step 4: "wgmma fed by TMA" (4-D boxes over (D, S, H, B)), "setmaxnreg gives its
    # registers away"; the backward: "wgmma.m64n64k16 ... dV, dK ... one bulk reduce-add" for dQ
    ("attention/04_wgmma_tma.cu", "attention_forward_sm90I13__nv_bfloat16Li128", lambda ops: {
        "HGMMA.64x128x16.F32.BF16", "UTMALDG.4D", "USETMAXREG.DEALLOC.CTAPOOL", "USETMAXREG.TRY_ALLOC.CTAPOOL"} <= set(ops)),
    ("attention/04_wgmma_tma.cu", "attention_bwd_sm90I13__nv_bfloat16Li128", lambda ops: {
        "HGMMA.64x64x16.F32.BF16", "HGMMA.64x128x16.F32.BF16", "UTMALDG.4D", "UBLKRED.G.S.ADD.F32.RN"} <= set(ops)),
    # attention step 3: "mma.sync m16n8k16 ... ldmatrix ... cp.async" (zero-filled 16-byte copies)
    ("attention/03_mma_sync.cu", "attention_forwardI13__nv_bfloat16Li128", lambda ops: "HMMA.16816.F32.BF16" in ops
     and any(o.startswith("LDSM") for o in ops) and any(o.startswith("LDGSTS.E.BYPASS.128") for o in ops)),
    # "LDG.E.128 / STG.E.128 ... warp shuffles (SHFL.BFLY, 5 per warp)" (read-only loads: .CONSTANT)
    ("softmax/03_warp_shuffle_vectorized.cu", "softmax_warp_shuffleIfE",
     lambda ops: {"LDG.E.128.CONSTANT", "STG.E.128", "SHFL.BFLY"} <= set(ops)),
    # pick_load_hint: the backward tile's y and dy loads (2 vectors x 2 tensors) are LDG.E.EF.128
    # evict-first (ld.global.cs), LDG.E.EL.128 evict-last (the createpolicy cache hint), and the plain
    # one's read-only LDG.E.128.CONSTANT
    ("softmax/05_row_on_chip.cu", "backward_block_rowI13__nv_bfloat16Li256ELi16ELi5ELb1ELNS_6L2HintE1EE",
     lambda ops: ops.count("LDG.E.EF.128") == 4 and "LDG.E.128.CONSTANT" not in ops),
    ("softmax/05_row_on_chip.cu", "backward_block_rowI13__nv_bfloat16Li256ELi16ELi5ELb1ELNS_6L2HintE2EE",
     lambda ops: ops.count("LDG.E.EL.128") == 4 and "LDG.E.128.CONSTANT" not in ops),
    ("softmax/05_row_on_chip.cu", "backward_block_rowI13__nv_bfloat16Li256ELi16ELi5ELb1ELNS_6L2HintE0EE",
     lambda ops: ops.count("LDG.E.128.CONSTANT") == 4 and not {"LDG.E.EF.128", "LDG.E.EL.128"} & set(ops)),
    # rows off 16 bytes: "read as the 16-byte vectors of memory it overlaps" (8 loads in flight a thread),
    # written through whole 16-byte stores, never split into 4-byte ones (STG.E in a 16-bit kernel)
    ("softmax/05_row_on_chip.cu", "softmax_row_in_smemI13__nv_bfloat16E", lambda ops: ops.count("LDG.E.128.CONSTANT") == 8
     and "STG.E.128" in ops and "STG.E" not in ops),
    ("softmax/05_row_on_chip.cu", "backward_row_in_smemI13__nv_bfloat16E", lambda ops: ops.count("LDG.E.128.CONSTANT") == 6
     and "STG.E.128" in ops and "STG.E" not in ops),
    ("softmax/06_cluster.cu", "softmax_clusterI13__nv_bfloat16E", lambda ops: ops.count("LDG.E.128.CONSTANT") == 8
     and "STG.E.128" in ops and "STG.E" not in ops),
    ("softmax/06_cluster.cu", "backward_clusterI13__nv_bfloat16E", lambda ops: ops.count("LDG.E.128.CONSTANT") == 6
     and "STG.E.128" in ops and "STG.E" not in ops),
    # "loads 32 elements ... per tensor (8 16-byte vectors of fp32)" and "lane r stores ... with st.async"
    ("softmax/07_cluster_registers.cu", "softmax_cluster_registersIfE",
     lambda ops: "STAS.64" in ops and ops.count("LDG.E.128.CONSTANT") == 8),
    # the norms' step 4: "no thread loads x or dy ... one bulk copy per tensor" (two fill sites x two
    # tensors), each thread's two 16-byte vectors of each read from shared memory; the only 16-byte
    # global loads left are the weight's, "read once per CTA"
    ("layer_norm/04_bulk_rows.cu", "layer_norm_backward_ringI13__nv_bfloat16Li256ELi16ELi1ELb1E", lambda ops:
     ops.count("UBLKCP.S.G") == 4 and ops.count("LDS.128") == 4 and ops.count("LDG.E.128.CONSTANT") == 2),
    ("rms_norm/04_bulk_rows.cu", "rms_norm_backward_ringI13__nv_bfloat16Li256ELi16ELi1ELb1E", lambda ops:
     ops.count("UBLKCP.S.G") == 4 and ops.count("LDS.128") == 4 and ops.count("LDG.E.128.CONSTANT") == 2),
    # past 8,192 columns "CTA r ... rings its slice ... the row's sums cross the cluster by step 3's
    # exchange": the same bulk copies, the slots sent by st.async
    ("layer_norm/04_bulk_rows.cu", "layer_norm_backward_ringI13__nv_bfloat16Li512ELi16ELi4ELb1E", lambda ops:
     ops.count("UBLKCP.S.G") == 4 and "STAS.64" in ops),
    # "no thread loads them: thread 0 ... issues one bulk copy per tensor (cp.async.bulk global -> shared)"
    ("softmax/08_cluster_bulk.cu", "softmax_cluster_bulkIfE", lambda ops: ops.count("UBLKCP.S.G") == 1
     and "STAS.64" in ops and not any(o.startswith("LDG") for o in ops)),
    # "ptxas sinks them": step 3's four vector loads are not issued together, Philox multiplies between
    ("dropout/03_unrolled_vectors.cu", "I13__nv_bfloat16E", lambda ops: not four_loads_before_philox(ops)),
    # "all four loads leave at the vector path's start": no Philox multiply among them
    ("dropout/04_rolled_generator.cu", "I13__nv_bfloat16E", lambda ops: four_loads_before_philox(ops)),
]


def four_loads_before_philox(ops):
    """Four LDG.E.128 in a row when only the loads and the generator's multiplies (IMAD.WIDE) are kept."""
    kept = " ".join(o for o in ops if o.startswith(("LDG.E.128", "IMAD.WIDE")))
    return "LDG.E.128.CONSTANT " * 4 in kept + " "


@pytest.mark.skipif(NVCC is None or CUOBJDUMP is None, reason="nvcc or cuobjdump not available")
@pytest.mark.parametrize("source,kernel,claim", SASS_CLAIMS, ids=[f"{c[0]}:{c[1]}" for c in SASS_CLAIMS])
def test_sass_claims(compiled, source, kernel, claim):
    cubin, _ = compiled(cuda_build.CUDA_DIR / source)
    ops = sass_opcodes(cubin, kernel)
    assert ops, f"no kernel matching {kernel!r} in {source}"
    assert claim(ops), f"{source}: SASS does not show what the header claims:\n{' '.join(ops[:200])}"


def registers(report, kernel_substring):
    """Registers a thread (ptxas -v) of each kernel whose mangled name matches kernel_substring."""
    found, name = {}, None
    for line in report.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            name = m.group(1)
        elif (m := re.search(r"Used (\d+) registers", line)) and name:
            if fnmatch.fnmatchcase(name, f"*{kernel_substring}*"):
                found[name] = int(m.group(1))
            name = None
    return found


# Occupancy a header claims through a register count: (file, kernel, most registers a thread).
# The norms' step 3 forward: "16-bit tiles held to 40 registers (3 CTAs of 512 or 6 of 256 an SM)"
# without the row ahead, "held to 64 ... with a row ahead (2 CTAs of 512 or 4 of 256)".
REGISTER_CLAIMS = [(f"{op}/03_pipelined_rows.cu", f"{op}_rowsI{t}Li{threads}ELi16ELi1ELb1ELb{int(ahead)}E", most)
                   for op in ("layer_norm", "rms_norm") for t in ("13__nv_bfloat16", "6__half")
                   for threads in (256, 512) for ahead, most in ((False, 40), (True, 64))]


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("source,kernel,most", REGISTER_CLAIMS, ids=[f"{c[1]}<={c[2]}" for c in REGISTER_CLAIMS])
def test_register_claims(compiled, source, kernel, most):
    _, report = compiled(cuda_build.CUDA_DIR / source)
    found = registers(report, kernel)
    assert found, f"no kernel matching {kernel!r} in {source}"
    over = {n: r for n, r in found.items() if r > most}
    assert not over, f"{source}: the header claims at most {most} registers a thread: {over}"


def test_survey_fma_kernel_is_ffma(tmp_path, generated):
    """The FP32 peak microbenchmark must run FFMA: 16 x 8 of them in its loop body."""
    if NVCC is None or CUOBJDUMP is None:
        pytest.skip("nvcc or cuobjdump not available")
    from rosetta.survey import measure

    cubin, _ = compile_cu(measure.KERNELS, tmp_path, generated)
    assert sass_opcodes(cubin, "fma_chains").count("FFMA") >= 128
