"""The distinct checked cases of every op, and whether they dropped (ctest `checked_cases`).

A checked case is a triple (op, configuration, property): a configuration is one distinct call of
the op (shapes, dtypes, layout, options, a class of values) or one distinct argument set of a unit
of it (a kernel key and arch, a conversion's exhaustive sweep counted once); a property is one kind
of expectation on it (agreement with an independent oracle or with the reference, the refusal and
its message with nothing written, nothing written outside the outputs, equality with another
configuration, a classification or kernel key, ...). docs/testing.md says more.

* The op test driver's: `export_op_cases --count` (each case once per property the driver checks
  for it; the ones checked without a device apart; cases of one call, their name or seed apart,
  once).
* The bespoke tests' (tests/test_<op>*.cpp): the table BESPOKE, one entry per TEST with its count
  and how it was counted. The script fails when a TEST of those files has no entry or an entry
  names a TEST that is gone, so the table follows the files.

It fails too when the total, or an op's, falls below BEFORE: the counts before the driver took
the bespoke tests over (main at 3b0128b).

    python3 tests/checked_cases.py build/tests/export_op_cases
"""
import collections
import pathlib
import re
import subprocess
import sys

TESTS = pathlib.Path(__file__).resolve().parent

# Per op: (driver, bespoke) at 3b0128b, counted by this script's first version with calls that differ
# in their seed alone counted once (as export_op_cases --count does): fp8_linear's bespoke 417 were
# 172 distinct (its two seed sweeps: 220 as 35, 90 as 30).
BEFORE = {
    "causal_conv3d_cat_pad": (312, 501),
    "cross_head_qknorm_rope": (126, 0),
    "fp8_linear": (199, 172),
    "fp8_static_quant": (112, 1),
    "layernorm_modulate": (756, 500),
    "layernorm_modulate_fp8": (186, 45),
    "norm_scale_shift": (559, 326),
    "qk_head_layernorm": (49, 11),
    "qknorm_rope": (1669, 2855),
    "residual_gate_add": (507, 908),
    "token_cat_fp8": (160, 378),
}

# file -> {Suite.Test: (op, count, how)}
BESPOKE = {
    "test_residual_gate_add.cpp": {
        "ResidualGateAddMatch.GateModesAndAlignment":
            ("residual_gate_add", 14, "9 classifications, 3 dtypes per token, a transposed, an f32 chunk"),
        "ResidualGateAddMatch.TransposedResidualTakesAlignedChunksWhenOutSharesItsOffset":
            ("residual_gate_add", 10, "2 T x 4 offsets + 2 scalar update sides: classification"),
        "ResidualGateAddMatch.ExplainListsEveryCandidateWithItsReason":
            ("residual_gate_add", 3, "explain's candidates, its text, a strict jit backend refused"),
        "ResidualGateAddCApi.RunsAndReportsErrors":
            ("residual_gate_add", 4, "C ABI: a call (runs, equals the facade), an aliased call refused, explain"),
        "ResidualGateAddJit.EveryKernelKeyCompilesForEveryTargetArch":
            ("residual_gate_add", 516, "172 kernel keys x 3 archs compile"),
        "ResidualGateAddJit.FlatKernelUnitsFollowTheMeasuredSchedule":
            ("residual_gate_add", 7, "7 keys: units and template arguments"),
        "ResidualGateAddJit.PromotedGateAndStridedRowsReachTheKernel":
            ("residual_gate_add", 4, "2 keys, 2 matches"),
        "ResidualGateAddJit.FastDivisionEqualsIntegerDivisionBelowTwoToThe31":
            ("residual_gate_add", 1, "one sweep of the fast division"),
        "ResidualGateAddJit.SixtyFourBitIndicesFromTwoToThe31Units":
            ("residual_gate_add", 3, "the threshold, 2 keys"),
        "ResidualGateAddJit.FlatSizesOfThe32BitKernelLeadTheParams":
            ("residual_gate_add", 4, "the params' layout, 3 size fillings"),
        "ResidualGateAddJit.TransposedBlockHasOneThreadPerTileUnit":
            ("residual_gate_add", 9, "9 keys' block sizes"),
    },
    "test_residual_gate_add_gpu.cpp": {
        "ResidualGateAddGpu.FlatKernelIndexWidthsAndGridStrideLoopAgree":
            ("residual_gate_add", 28, "28 direct launches against the reference"),
        "ResidualGateAddGpu.ChunkedResidualKernelAgreesAtEveryLineOffset":
            ("residual_gate_add", 30, "30 direct launches against the reference"),
        "ResidualGateAddGpu.TallTileKernelAgreesBelowAtAndAcrossItsEdges":
            ("residual_gate_add", 10, "10 direct launches against the reference"),
        "ResidualGateAddGpu.SmallScalarCallsTakeTheirMeasuredSchedule":
            ("residual_gate_add", 9, "9 kernel keys chosen"),
        "ResidualGateAddGpu.CapturedInACudaGraphReplaysOnNewInputs":
            ("residual_gate_add", 4, "captured; 3 replays against the reference"),
    },
    "test_fp8_rowwise_quant.cpp": {
        "Fp8RowwiseDivision.TheFmaCorrectionEqualsTheIeeeQuotientForEveryRowValue":
            ("fp8_rowwise_quant", 1, "one exhaustive sweep (significand pairs x exponent offsets x 3 scales of s)"),
        "Fp8RowwiseQuantDescription.AllocRulesTakeThePrefixWidthWhereThereIsOne":
            ("fp8_rowwise_quant", 3, "out without and with prefix, out_scale: alloc shapes"),
        "Fp8RowwiseQuantMatching.TheVectorPathNeedsWholeUnitsAndAlignedRows":
            ("fp8_rowwise_quant", 7, "6 alignment classifications, a row stride"),
    },
    "test_token_cat_fp8.cpp": {
        "TokenCatFp8Matching.TheVectorPathNeedsAlignment":
            ("token_cat_fp8", 4, "4 alignment classifications"),
        "TokenCatFp8Matching.ScalesOutsideTheContractAndMixedDevicesAreRefused":
            ("token_cat_fp8", 9, "6 scales, 3 tensors on another device: refused, nothing written"),
        "TokenCatFp8Description.SlotsOptionsAndAllocRule":
            ("token_cat_fp8", 5, "slots, alloc rule, generic call, bad option, registry"),
        "TokenCatFp8Gpu.IssueShapesEveryImplementationByteEqualToTheReference":
            ("token_cat_fp8", 16, "4 shapes the driver leaves out: against the reference, the facade's choice, aligned16, the device's IEEE inverse"),
        "TokenCatFp8Gpu.SpecialValuesAndScalesOutsideTheContract":
            ("token_cat_fp8", 40, "5 scales outside the contract x 2 widths x the same 4"),
    },
    "test_causal_conv3d_cat_pad.cpp": {
        "CausalConv3dCatPadErrors.MixedDevices": ("causal_conv3d_cat_pad", 2, "2 refusals"),
        "CausalConv3dCatPadBindings.DescriptionTakesFPadOrderAndAllocatesThePaddedShape":
            ("causal_conv3d_cat_pad", 2, "slots, option defaults"),
        "CausalConv3dCatPadBindings.AllocRuleGivesThePaddedShape":
            ("causal_conv3d_cat_pad", 2, "shape, memory format"),
        "CausalConv3dCatPadBindings.GenericCallAndCAbiAgreeWithCatThenPad":
            ("causal_conv3d_cat_pad", 4, "generic call, C ABI, C ABI without cache, C ABI error"),
        "CausalConv3dCatPadJit.RowModelPicksTheKernel":
            ("causal_conv3d_cat_pad", 5, "aligned kernel: 5 calls; derived fields; index width"),
        "CausalConv3dCatPadJit.FastDivision64EqualsIntegerDivisionBelowTwoToThe63":
            ("causal_conv3d_cat_pad", 1, "a sweep, counted once"),
        "CausalConv3dCatPadGpu.BothKernelsAndIndexWidthsOnGridsThatLoop":
            ("causal_conv3d_cat_pad", 8, "2 kernels x 2 index widths x 2 grids, direct launches"),
    },
    "test_fp8_linear.cpp": {
        "Fp8LinearMatching.AWeightOnAnotherDeviceIsRefusedBeforeAnythingIsWritten":
            ("fp8_linear", 1, "a weight on another device refused, nothing written"),
        "Fp8LinearReference.QuantizedAndBf16InputsAgreeAndBothReciprocalsRun":
            ("fp8_linear", 3, "quantized x equals bf16 x, div_full equals ieee, the quantizer runs"),
        "Fp8LinearDispatch.ExplainSaysWhichPathAShapeTakesAndWhy": ("fp8_linear", 8, "8 explain verdicts"),
        "Fp8LinearWhitelist.CoversTheIssueShapesAndNothingIsMeasuredYet":
            ("fp8_linear", 75, "74 whitelist look-ups, the entries' fields"),
        "Fp8LinearDescription.SlotsAndAllocRule": ("fp8_linear", 3, "slots, alloc rule, compile variants"),
        "CublasLtLoader.LoadsHereOrSaysWhy": ("fp8_linear", 1, "the loader"),
        "CublasLtLoader.AMissingLibraryGivesAClearReason": ("fp8_linear", 3, "missing library, status, workspace"),
    },
    "test_layernorm_modulate.cpp": {
        "E4m3.DecodesTheFormat": ("layernorm_modulate", 1, "the decoder"),
        "E4m3.EveryCodeRoundTrips": ("layernorm_modulate", 1, "every code"),
        "E4m3.MidpointsTieToEvenAndNeighboursRoundToNearest": ("layernorm_modulate", 1, "every midpoint"),
        "E4m3.RangeEndsFollowC10": ("layernorm_modulate", 1, "the range ends"),
        "E4m3.RandomValuesMatchANearestSearch": ("layernorm_modulate", 1, "a nearest search"),
        "AtenStats.NewtonStepFromAnyNearbySeedGivesTheIeeeReciprocalOfEveryCount":
            ("layernorm_modulate", 1, "every count"),
        "AtenStats.TwinMatchesAnIndependentSimulationBitForBit":
            ("layernorm_modulate", 54, "18 widths x 3 amplitudes"),
        "AtenStats.TheOrderIsVisible": ("layernorm_modulate", 2, "every width, head widths"),
        "AtenStats.AgreeWithFloat64TwoPassWithinStatedBounds": ("layernorm_modulate", 36, "4 x 3 x 3 rows"),
        "AtenStats.RsqrtTwinIsCorrectlyRoundedWithTheSubnormalPath": ("layernorm_modulate", 1, "the rsqrt twin"),
        "LayerNormModulateExplain.ListsEveryCandidateWithItsReason":
            ("layernorm_modulate", 3, "explain bf16 (candidates, text), explain fp8"),
        "LayerNormModulateKernels.EveryKeyCompilesWithNvrtcForTheTargetArchs":
            ("layernorm_modulate", 96, "44 + 2 x 13 sampled keys, 8 qk keys x 3 archs, the knobs, the self-check"),
    },
    "test_layernorm_modulate_gpu.cpp": {
        "LayerNormModulateGpu.PrimitivesRcp4IsTheIeeeReciprocalAndRsqrtHasTheSubnormalPath":
            ("layernorm_modulate", 2, "rcp4, rsqrt on the device"),
    },
    "test_norm_scale_shift.cpp": {
        "NssConverters.E4m3MatchesNearestValueSearchEverywhere": ("norm_scale_shift", 1, "every probe"),
        "NssConverters.E2m1MatchesNearestValueSearchEverywhere": ("norm_scale_shift", 1, "every probe"),
        "NssSwizzle.OffsetsFollowThe128x4LayoutAndCoverThePaddedTensor":
            ("norm_scale_shift", 2, "anchors, coverage"),
        "NssBroadcast.MatchedClassesAreReported": ("norm_scale_shift", 3, "3 classifications"),
        "NssStatistics.EagerModulationRoundsEachOp": ("norm_scale_shift", 1, "the eager chain"),
        "NssMatching.ExplainChoosesTheReferenceOnTheCpu": ("norm_scale_shift", 1, "explain"),
        "NssJit.KernelKeysCompileForEveryTargetArch": ("norm_scale_shift", 39, "13 keys x 3 archs"),
        "NssJit.RowPositionsAdvancedByTheStepEqualDivision": ("norm_scale_shift", 1, "one sweep"),
        "NssJit.EagerScheduleFollowsTheMeasuredRules": ("norm_scale_shift", 12, "12 keys' schedules"),
        "NssJit.Float32ChainScheduleHoldsItsOperandsWhereTheyFit": ("norm_scale_shift", 8, "8 keys' schedules"),
        "NssMatching.Float32ChainTakesFloat32OperandsAndOptionalModulation":
            ("norm_scale_shift", 3, "classification, runs, numerics=eager refuses"),
        "NssJit.HardwareE2m1KeyIsRefusedOnSm90": ("norm_scale_shift", 1, "refused key"),
        "NssMatching.Fp8RowwiseNeedsBothOutputsAndHasAnImplementationOfItsOwn":
            ("norm_scale_shift", 5, "2 halves of a pair refused, a run, the key and its argument, 2 dispatch choices"),
    },
    "test_norm_scale_shift_gpu.cpp": {
        "NormScaleShiftGpu.Nvfp4BytesFollowTheDevicesOwnY":
            ("norm_scale_shift", 52, "10 NVFP4 calls x 2 conversions: padding rows zero; 6 x 2 with y: exact against the device's own y"),
        "NormScaleShiftGpu.Nvfp4ConversionsMatchTheReferenceForEveryInput":
            ("norm_scale_shift", 3, "E2M1 over 2^32 inputs, canonical NaN, E4M3 decode"),
        "NormScaleShiftGpu.PackedProductsEqualTheFp32ProductRounded": ("norm_scale_shift", 2, "bf16, f16 pairs"),
        "NormScaleShiftGpu.HardwareE2m1IsRefusedWhereTheDeviceLacksIt": ("norm_scale_shift", 1, "refusal"),
    },
    "test_qknorm_rope_reference.cpp": {
        "HalfConversion.Fp16AllPatternsWidenExactlyAndRoundTrip": ("qknorm_rope", 1, "every pattern"),
        "HalfConversion.Bf16AllPatternsWidenExactlyAndRoundTrip": ("qknorm_rope", 1, "every pattern"),
        "HalfConversion.NarrowingMatchesIndependentRounding": ("qknorm_rope", 3, "f16, bf16, NaNs"),
        "HalfConversion.LoadStoreAct": ("qknorm_rope", 1, "load/store"),
        "QkNormRopeReference.LargePositionsSparseCache":
            ("qknorm_rope", 4, "2 calls: the bytes of the same rows in a small cache, q and k written"),
        "QkNormRopeReference.Int64PositionsBeyond32Bits":
            ("qknorm_rope", 2, "1 call: the same 2"),
        "QkNormRopeReference.EmptyTokensIsANoOp": ("qknorm_rope", 2, "empty, null pointers"),
        "QkNormRopeReference.RejectsCallsItCannotRunSafely": ("qknorm_rope", 3, "3 refusals"),
    },
    "test_qknorm_rope_gpu.cpp": {
        "QkNormRopeGpu.CpuTensorToExplicitCudaBackendIsRefused": ("qknorm_rope", 1, "refusal"),
        "QkNormRopeGpu.CheckedModeRefusesPositionsOutsideTheCacheAndWritesNothing":
            ("qknorm_rope", 5, "2 bad positions, nothing written, checked equals unchecked, capture refused"),
    },
}

TEST_RE = re.compile(r"^TEST(?:_F|_P)?\((\w+),\s*(\w+)\)", re.M)


def driver_counts(exporter):
    """{op: (checked with a device, of them without one)} from export_op_cases --count."""
    run = subprocess.run([exporter, "--count"], check=True, capture_output=True, text=True)
    print(run.stderr.strip())
    out = run.stdout
    counts = collections.defaultdict(lambda: [0, 0])
    for line in out.splitlines():
        op, _, n, cpu = line.split("\t")
        counts[op][0] += int(n)
        counts[op][1] += int(cpu)
    return counts


def per_op_files(ops):
    """The bespoke test files of the ops: tests/test_<op>*.cpp."""
    files = set()
    for path in TESTS.glob("test_*.cpp"):
        stem = path.stem[len("test_"):]
        if any(stem == op or stem.startswith(op + "_") for op in ops):
            files.add(path.name)
    return files


def main():
    exporter = sys.argv[1] if len(sys.argv) > 1 else "build/tests/export_op_cases"
    driver = driver_counts(exporter)
    problems = []
    bespoke = collections.Counter()
    files = per_op_files(driver)
    for name in sorted(files | set(BESPOKE)):
        path = TESTS / name
        found = {f"{s}.{t}" for s, t in TEST_RE.findall(path.read_text())} if path.exists() else set()
        table = BESPOKE.get(name, {})
        problems += [f"{name}: {t} has no entry in BESPOKE" for t in sorted(found - set(table))]
        problems += [f"{name}: BESPOKE names {t}, which is gone" for t in sorted(set(table) - found)]
        for test, (op, n, _) in table.items():
            if test in found:
                bespoke[op] += n
    ops = sorted(set(driver) | set(bespoke))
    print(f"{'op':24} {'driver':>8} {'(no GPU)':>8} {'bespoke':>8} {'total':>8} {'before':>8}")
    total = total_before = 0
    for op in ops:
        d, cpu = driver.get(op, (0, 0))
        before = sum(BEFORE.get(op, (0, 0)))
        total += d + bespoke[op]
        total_before += before
        print(f"{op:24} {d:8} {cpu:8} {bespoke[op]:8} {d + bespoke[op]:8} {before:8}")
        if d + bespoke[op] < before:
            problems.append(f"{op}'s distinct checked cases dropped: {d + bespoke[op]} < {before} before")
    print(f"{'all':24} {sum(d for d, _ in driver.values()):8} {sum(c for _, c in driver.values()):8} "
          f"{sum(bespoke.values()):8} {total:8} {total_before:8}")
    if total < total_before:
        problems.append(f"the distinct checked cases dropped: {total} < {total_before} before")
    for p in problems:
        print("FAIL:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
