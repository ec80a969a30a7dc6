"""The NVML backend of the long-window sampler (source "nvml").

Every GPU is keyed by its UUID (the NVML ordinal changes with CUDA_VISIBLE_DEVICES and
reboots; Slurm's GRES index is the /dev/nvidiaN minor, neither names a GPU). Per read:

- Buffered metrics, averaged over everything the driver sampled since the previous read
  (`nvmlDeviceGetSamples` with the last timestamp seen, so nothing is counted twice):
  `gpu_utilization` (percent, the driver's duty cycle), `power_w` (watts; NVML gives mW),
  `sm_clock_mhz` (mhz). `points` = number of driver samples. When the GPU does not buffer a
  metric (NOT_SUPPORTED) the row is one reading at the read instead and says so:
  `<metric>_instant`, t_from = t_to, points = 1 (an instantaneous duty cycle standing for a
  whole interval is the aliasing this sampler exists to avoid).
- Gauges read at the read (t_from = t_to, points = 1): `memory_used_bytes`,
  `memory_total_bytes` (bytes), `temperature_c` (celsius).
- Per process (entity "<uuid>/pid:<pid>", as the dataset's key needs one entity per series):
  `process_sm_utilization` (percent, mean of the driver's per-process samples since the
  last read) and `process_memory_used_bytes` (bytes, at the read), attributed by `attribute`.
- GPM (Hopper+): `sm_activity`, `sm_occupancy` (percent) between two GPM samples > 100 ms
  apart; no duty-cycle aliasing. A GPU without GPM gets one gap row per (GPU, metric) for the
  sampler's lifetime ("not supported by this GPU"), as does any metric NOT_SUPPORTED.

Errors never escape `read()`: a lost GPU, an unknown error or a failing metric is a gap row
(entity = UUID, metric or None, reason naming the NVML error) and the other GPUs keep
sampling. Only nvmlInit failing (no driver, no library) raises, as NvmlUnavailable.
The first read only primes the driver timestamps and GPM samples; it returns gap rows only.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tasks.data.errors import CkptPocError
from tasks.window.sampling import (
    UNATTRIBUTED,
    Attribution,
    Attributor,
    GapRow,
    SampleRow,
    gap_row,
    sample_row,
)

SOURCE = "nvml"
GPM_MIN_INTERVAL_S = 0.1  # NVML: two GPM samples must be more than 100 ms apart
GPM_SM_UTIL = 2
GPM_SM_OCCUPANCY = 3
GPM_METRICS = {GPM_SM_UTIL: "sm_activity", GPM_SM_OCCUPANCY: "sm_occupancy"}

GpuOwner = Callable[[str, int | None], Attribution]


class NvmlUnavailable(CkptPocError):
    """NVML cannot be used on this node at all (no library, no driver, init refused)."""


@dataclass
class _Buffered:
    """A metric the driver buffers: what we saw last, so the next read asks only for newer."""

    metric: str
    unit: str
    sampling_type: int
    scale: float  # NVML unit → row unit (mW → W)
    last_ts: int = 0  # driver µs timestamp of the newest sample counted
    last_wall: dt.datetime | None = None  # when it was last read successfully


@dataclass
class _Gpu:
    index: int
    uuid: str
    minor: int | None
    handle: Any
    buffered: list[_Buffered]
    proc_last_ts: int = 0
    proc_last_wall: dt.datetime | None = None
    gpm_supported: bool | None = None  # None: not asked yet
    gpm_sample: Any = None
    gpm_mono: float = 0.0
    gpm_wall: dt.datetime | None = None
    once: set[str] = field(default_factory=set)  # (metric) gaps reported for the lifetime


class _GpuLost(Exception):
    """Internal: stop reading this GPU for this read."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class NvmlSampler:
    """A `Backend`: NVML readings of every GPU on this node, keyed by UUID."""

    source = SOURCE

    def __init__(self, node: str, attribute: Attributor, gpu_owner: GpuOwner | None = None) -> None:
        try:
            import pynvml  # imported here: a node without nvidia-ml-py fails clearly
        except ImportError as exc:
            raise NvmlUnavailable(f"NVML sampler: nvidia-ml-py is not installed ({exc})") from exc
        self._nv = pynvml
        self.node = node
        self._attribute = attribute
        self._gpu_owner = gpu_owner
        self._error_names = {
            getattr(pynvml, n): n for n in dir(pynvml) if n.startswith("NVML_ERROR_")
        }
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(
                f"NVML sampler: nvmlInit failed: {self._describe(exc)} "
                "(no NVIDIA driver or libnvidia-ml.so.1 on this node?)"
            ) from exc
        self._open = True
        self._init_gaps: list[str] = []
        self._gpus: list[_Gpu] = []
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            self.close()
            raise NvmlUnavailable(
                f"NVML sampler: nvmlDeviceGetCount failed: {self._describe(exc)}"
            ) from exc
        for i in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
            except pynvml.NVMLError as exc:
                # Without a UUID the GPU cannot be named; say so once, on the first read.
                self._init_gaps.append(f"GPU at NVML index {i} unreadable: {self._describe(exc)}")
                continue
            try:
                minor: int | None = pynvml.nvmlDeviceGetMinorNumber(handle)
            except pynvml.NVMLError:
                minor = None  # only gpu_owner needs it
            self._gpus.append(
                _Gpu(
                    index=i,
                    uuid=uuid,
                    minor=minor,
                    handle=handle,
                    buffered=[
                        _Buffered(
                            "gpu_utilization", "percent", pynvml.NVML_GPU_UTILIZATION_SAMPLES, 1
                        ),
                        _Buffered("power_w", "watts", pynvml.NVML_TOTAL_POWER_SAMPLES, 1e-3),
                        _Buffered("sm_clock_mhz", "mhz", pynvml.NVML_PROCESSOR_CLK_SAMPLES, 1),
                    ],
                )
            )
        self._last_wall: dt.datetime | None = None

    @property
    def gpu_uuids(self) -> list[str]:
        return [g.uuid for g in self._gpus]

    # -- reading ---------------------------------------------------------------------------

    def read(self) -> tuple[list[SampleRow], list[GapRow]]:
        now = _now()
        priming = self._last_wall is None
        t_from = self._last_wall or now
        rows: list[SampleRow] = []
        gaps: list[GapRow] = []
        for reason in self._init_gaps:
            gaps.append(self._gap(t_from, now, reason, entity=None))
        self._init_gaps = []
        for gpu in self._gpus:
            g_rows: list[SampleRow] = []
            try:
                self._read_gpu(gpu, t_from, now, priming, g_rows, gaps)
            except _GpuLost as lost:
                gaps.append(self._gap(t_from, now, lost.reason, entity=gpu.uuid))
            rows.extend(g_rows)
        self._last_wall = now
        return rows, gaps

    def _read_gpu(
        self,
        gpu: _Gpu,
        t_from: dt.datetime,
        now: dt.datetime,
        priming: bool,
        rows: list[SampleRow],
        gaps: list[GapRow],
    ) -> None:
        nv = self._nv
        # Processes first: their attribution labels the GPU-level rows.
        procs = self._call(
            gpu,
            "process_memory_used_bytes",
            t_from,
            now,
            gaps,
            nv.nvmlDeviceGetComputeRunningProcesses,
        )
        proc_attr = {p.pid: self._attribute(p.pid) for p in procs or []}
        gpu_attr = self._gpu_attribution(gpu, proc_attr)

        def add(metric: str, unit: str, value: float, start: dt.datetime, points: int) -> None:
            rows.append(
                sample_row(
                    node=self.node,
                    source=SOURCE,
                    entity=gpu.uuid,
                    device="gpu",
                    metric=metric,
                    unit=unit,
                    value=value,
                    t_from=start,
                    t_to=now,
                    points=points,
                    gpu_uuid=gpu.uuid,
                    gpu_index=gpu.index,
                    attribution=gpu_attr,
                )
            )

        for buf in gpu.buffered:
            self._read_buffered(gpu, buf, t_from, now, priming, gaps, add)

        if not priming:
            mem = self._call(
                gpu, "memory_used_bytes", t_from, now, gaps, nv.nvmlDeviceGetMemoryInfo
            )
            if mem is not None:
                add("memory_used_bytes", "bytes", mem.used, now, 1)
                add("memory_total_bytes", "bytes", mem.total, now, 1)
            temp = self._call(
                gpu,
                "temperature_c",
                t_from,
                now,
                gaps,
                nv.nvmlDeviceGetTemperature,
                nv.NVML_TEMPERATURE_GPU,
            )
            if temp is not None:
                add("temperature_c", "celsius", temp, now, 1)

        self._read_processes(gpu, procs, proc_attr, t_from, now, priming, rows, gaps)
        self._read_gpm(gpu, t_from, now, gaps, add)

    def _read_buffered(
        self,
        gpu: _Gpu,
        buf: _Buffered,
        t_from: dt.datetime,
        now: dt.datetime,
        priming: bool,
        gaps: list[GapRow],
        add: Callable[[str, str, float, dt.datetime, int], None],
    ) -> None:
        nv = self._nv
        if f"{buf.metric}:instant" in gpu.once:
            self._read_instant(gpu, buf, t_from, now, priming, gaps, add)
            return
        try:
            vtype, samples = nv.nvmlDeviceGetSamples(gpu.handle, buf.sampling_type, buf.last_ts)
        except nv.NVMLError as exc:
            code = exc.value
            if code == nv.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost(self._describe(exc)) from exc
            if code == nv.NVML_ERROR_NOT_FOUND:
                # Nothing buffered since last_ts: the driver did not sample in the interval.
                if not priming:
                    gaps.append(
                        self._gap(
                            buf.last_wall or t_from,
                            now,
                            f"no driver samples since the last read ({self._describe(exc)})",
                            entity=gpu.uuid,
                            metric=buf.metric,
                        )
                    )
                buf.last_wall = now
                return
            if code in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_FUNCTION_NOT_FOUND):
                # Not buffered on this GPU: fall back to one reading per read, named as such.
                gpu.once.add(f"{buf.metric}:instant")
                self._read_instant(gpu, buf, t_from, now, priming, gaps, add)
                return
            gaps.append(
                self._gap(t_from, now, self._describe(exc), entity=gpu.uuid, metric=buf.metric)
            )
            return
        start = buf.last_wall or t_from
        if samples:
            buf.last_ts = max(buf.last_ts, *(s.timeStamp for s in samples))
        buf.last_wall = now
        if priming or not samples:
            return  # the first read's buffer covers an unknown past: it only primes last_ts
        values = [_value(s.sampleValue, vtype) * buf.scale for s in samples]
        add(buf.metric, buf.unit, sum(values) / len(values), start, len(values))

    def _read_instant(
        self,
        gpu: _Gpu,
        buf: _Buffered,
        t_from: dt.datetime,
        now: dt.datetime,
        priming: bool,
        gaps: list[GapRow],
        add: Callable[[str, str, float, dt.datetime, int], None],
    ) -> None:
        nv = self._nv
        metric = f"{buf.metric}_instant"
        if buf.sampling_type == nv.NVML_GPU_UTILIZATION_SAMPLES:
            value = self._call(gpu, metric, t_from, now, gaps, nv.nvmlDeviceGetUtilizationRates)
            value = None if value is None else value.gpu
        elif buf.sampling_type == nv.NVML_TOTAL_POWER_SAMPLES:
            value = self._call(gpu, metric, t_from, now, gaps, nv.nvmlDeviceGetPowerUsage)
        else:
            value = self._call(
                gpu, metric, t_from, now, gaps, nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM
            )
        if value is not None and not priming:
            add(metric, buf.unit, value * buf.scale, now, 1)

    def _read_processes(
        self,
        gpu: _Gpu,
        procs: list[Any] | None,
        proc_attr: dict[int, Attribution],
        t_from: dt.datetime,
        now: dt.datetime,
        priming: bool,
        rows: list[SampleRow],
        gaps: list[GapRow],
    ) -> None:
        nv = self._nv
        start = gpu.proc_last_wall or t_from
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(gpu.handle, gpu.proc_last_ts)
        except nv.NVMLError as exc:
            if exc.value == nv.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost(self._describe(exc)) from exc
            if exc.value == nv.NVML_ERROR_NOT_FOUND:
                samples = []  # nothing new since proc_last_ts: not an error
            else:
                self._metric_gap(gpu, "process_sm_utilization", t_from, now, exc, gaps)
                samples = None
        if samples is not None:
            gpu.proc_last_wall = now
        by_pid: dict[int, list[int]] = {}
        for s in samples or []:
            gpu.proc_last_ts = max(gpu.proc_last_ts, s.timeStamp)
            by_pid.setdefault(s.pid, []).append(s.smUtil)
        if priming:
            return
        for pid, sms in sorted(by_pid.items()):
            attr = proc_attr.get(pid) or self._attribute(pid)
            rows.append(
                self._proc_row(
                    gpu,
                    pid,
                    "process_sm_utilization",
                    "percent",
                    sum(sms) / len(sms),
                    start,
                    now,
                    len(sms),
                    attr,
                )
            )
        for p in procs or []:
            if p.usedGpuMemory is not None:
                rows.append(
                    self._proc_row(
                        gpu,
                        p.pid,
                        "process_memory_used_bytes",
                        "bytes",
                        p.usedGpuMemory,
                        now,
                        now,
                        1,
                        proc_attr[p.pid],
                    )
                )

    def _proc_row(
        self,
        gpu: _Gpu,
        pid: int,
        metric: str,
        unit: str,
        value: float,
        start: dt.datetime,
        now: dt.datetime,
        points: int,
        attr: Attribution,
    ) -> SampleRow:
        return sample_row(
            node=self.node,
            source=SOURCE,
            entity=f"{gpu.uuid}/pid:{pid}",
            device="gpu",
            metric=metric,
            unit=unit,
            value=value,
            t_from=start,
            t_to=now,
            points=points,
            gpu_uuid=gpu.uuid,
            gpu_index=gpu.index,
            pid=pid,
            attribution=attr,
        )

    def _read_gpm(
        self,
        gpu: _Gpu,
        t_from: dt.datetime,
        now: dt.datetime,
        gaps: list[GapRow],
        add: Callable[[str, str, float, dt.datetime, int], None],
    ) -> None:
        nv = self._nv
        if gpu.gpm_supported is None:
            try:
                gpu.gpm_supported = bool(nv.nvmlGpmQueryDeviceSupport(gpu.handle).isSupportedDevice)
            except nv.NVMLError as exc:
                if exc.value == nv.NVML_ERROR_GPU_IS_LOST:
                    raise _GpuLost(self._describe(exc)) from exc
                gpu.gpm_supported = False  # an old driver (FUNCTION_NOT_FOUND) is "no GPM"
            if not gpu.gpm_supported:
                for metric in GPM_METRICS.values():
                    gaps.append(
                        self._gap(
                            t_from,
                            now,
                            "not supported by this GPU (no GPM)",
                            entity=gpu.uuid,
                            metric=metric,
                        )
                    )
        if not gpu.gpm_supported:
            return
        mono = time.monotonic()
        if gpu.gpm_sample is not None and mono - gpu.gpm_mono <= GPM_MIN_INTERVAL_S:
            return  # too close to the previous sample: keep it, the next read spans longer
        try:
            sample = nv.nvmlGpmSampleAlloc()
        except nv.NVMLError as exc:
            self._metric_gap(gpu, None, t_from, now, exc, gaps, metrics=GPM_METRICS.values())
            return
        try:
            nv.nvmlGpmSampleGet(gpu.handle, sample)
        except nv.NVMLError as exc:
            nv.nvmlGpmSampleFree(sample)
            if exc.value == nv.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost(self._describe(exc)) from exc
            self._metric_gap(gpu, None, t_from, now, exc, gaps, metrics=GPM_METRICS.values())
            return
        prev, prev_wall = gpu.gpm_sample, gpu.gpm_wall
        gpu.gpm_sample, gpu.gpm_mono, gpu.gpm_wall = sample, mono, now
        if prev is None:
            return
        try:
            get = nv.c_nvmlGpmMetricsGet_t()
            get.version = nv.NVML_GPM_METRICS_GET_VERSION
            get.numMetrics = len(GPM_METRICS)
            get.sample1, get.sample2 = prev, sample
            for i, metric_id in enumerate(GPM_METRICS):
                get.metrics[i].metricId = metric_id
            nv.nvmlGpmMetricsGet(get)
        except nv.NVMLError as exc:
            if exc.value == nv.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost(self._describe(exc)) from exc
            self._metric_gap(gpu, None, t_from, now, exc, gaps, metrics=GPM_METRICS.values())
            return
        finally:
            with contextlib.suppress(nv.NVMLError):  # a failed free leaks a sample, no more
                nv.nvmlGpmSampleFree(prev)
        for i, metric in enumerate(GPM_METRICS.values()):
            m = get.metrics[i]
            if m.nvmlReturn == nv.NVML_SUCCESS:
                add(metric, "percent", m.value, prev_wall or t_from, 1)
            else:
                self._metric_gap(gpu, metric, t_from, now, nv.NVMLError(m.nvmlReturn), gaps)

    # -- helpers ---------------------------------------------------------------------------

    def _gpu_attribution(self, gpu: _Gpu, proc_attr: dict[int, Attribution]) -> Attribution:
        if self._gpu_owner is not None:
            owner = self._gpu_owner(gpu.uuid, gpu.minor)
            if owner.attributed_by != "none":
                return owner
        # Processes of exactly one PoC job: the GPU is that job's; several or none: nobody's.
        jobs = {a.job_id: a for a in proc_attr.values() if a.job_id is not None}
        return next(iter(jobs.values())) if len(jobs) == 1 else UNATTRIBUTED

    def _call(
        self,
        gpu: _Gpu,
        metric: str,
        t_from: dt.datetime,
        now: dt.datetime,
        gaps: list[GapRow],
        fn: Callable[..., Any],
        *args: Any,
    ) -> Any:
        """fn(handle, *args); a lost GPU stops this GPU's read, other errors are gap rows."""
        try:
            return fn(gpu.handle, *args)
        except self._nv.NVMLError as exc:
            if exc.value == self._nv.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost(self._describe(exc)) from exc
            self._metric_gap(gpu, metric, t_from, now, exc, gaps)
            return None

    def _metric_gap(
        self,
        gpu: _Gpu,
        metric: str | None,
        t_from: dt.datetime,
        now: dt.datetime,
        exc: Exception,
        gaps: list[GapRow],
        metrics: Any = None,
    ) -> None:
        for m in list(metrics) if metrics is not None else [metric]:
            if getattr(exc, "value", None) == self._nv.NVML_ERROR_NOT_SUPPORTED:
                # Permanent: one gap row for the sampler's lifetime, not one per interval.
                if m in gpu.once:
                    continue
                gpu.once.add(m)
            gaps.append(self._gap(t_from, now, self._describe(exc), entity=gpu.uuid, metric=m))

    def _gap(
        self,
        t_from: dt.datetime,
        t_to: dt.datetime,
        reason: str,
        *,
        entity: str | None,
        metric: str | None = None,
    ) -> GapRow:
        return gap_row(
            node=self.node,
            source=SOURCE,
            t_from=t_from,
            t_to=t_to,
            reason=reason,
            detected_by="sampler",
            entity=entity,
            metric=metric,
        )

    def _describe(self, exc: Exception) -> str:
        code = getattr(exc, "value", None)
        name = self._error_names.get(code, f"NVML error {code}")
        return f"{name}: {exc}"

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        for gpu in self._gpus:
            if gpu.gpm_sample is not None:
                with contextlib.suppress(self._nv.NVMLError):  # best effort at shutdown
                    self._nv.nvmlGpmSampleFree(gpu.gpm_sample)
                gpu.gpm_sample = None
        self._nv.nvmlShutdown()


_VALUE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def _value(value: Any, vtype: int) -> float:
    """The nvmlValue_t union's member the driver says it filled."""
    return float(getattr(value, _VALUE_FIELDS[vtype] if 0 <= vtype < 7 else "dVal"))
