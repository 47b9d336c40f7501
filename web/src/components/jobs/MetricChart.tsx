// One metric as a small SVG line chart (x: step): hover or arrow keys read exact values; optional
// EMA smoothing draws the raw series faintly behind the smoothed one.
import { type KeyboardEvent, type PointerEvent, type RefObject, useEffect, useMemo, useRef, useState } from "react";
import { formatClock, formatMetric } from "../../lib/format";
import { decimate, niceTicks, type Point, smooth } from "../../lib/metrics";

const HEIGHT = 130;
const M = { left: 46, right: 10, top: 8, bottom: 20 };
const MAX_DRAWN = 600;

function useWidth<T extends HTMLElement>(): [RefObject<T | null>, number] {
  const ref = useRef<T>(null);
  const [width, setWidth] = useState(320);
  useEffect(() => {
    const el = ref.current;
    if (!el || typeof ResizeObserver === "undefined") return;
    const ro = new ResizeObserver((entries) => {
      const w = entries[0]?.contentRect.width;
      if (w && Math.abs(w - width) > 1) setWidth(Math.floor(w));
    });
    ro.observe(el);
    return () => ro.disconnect();
  }, [width]);
  return [ref, width];
}

/** An SVG path through the finite points; a non-finite value breaks the line. */
function pathOf(xs: readonly number[], ys: readonly number[]): string {
  let d = "";
  let pen = false;
  for (let i = 0; i < xs.length; i++) {
    const x = xs[i] as number;
    const y = ys[i] as number;
    if (!Number.isFinite(y)) {
      pen = false;
      continue;
    }
    d += `${pen ? "L" : "M"}${x.toFixed(1)},${y.toFixed(1)}`;
    pen = true;
  }
  return d;
}

export function MetricChart({ name, points, smoothing }: { name: string; points: readonly Point[]; smoothing: number }) {
  const [wrapRef, width] = useWidth<HTMLDivElement>();
  const [cursor, setCursor] = useState<number | null>(null);

  const view = useMemo(() => {
    const drawn = decimate(points, MAX_DRAWN);
    const values = drawn.map((p) => p.value);
    const smoothed = smoothing > 0 ? smooth(values, smoothing) : values;
    const finite = values.filter(Number.isFinite);
    let lo = finite.length ? Math.min(...finite) : 0;
    let hi = finite.length ? Math.max(...finite) : 1;
    if (lo === hi) {
      const pad = Math.abs(lo) * 0.1 || 1;
      lo -= pad;
      hi += pad;
    } else {
      const pad = (hi - lo) * 0.06;
      lo -= pad;
      hi += pad;
    }
    const first = drawn[0]?.step ?? 0;
    const last = drawn[drawn.length - 1]?.step ?? 1;
    const x0 = first;
    const x1 = last === first ? first + 1 : last;
    const innerW = Math.max(10, width - M.left - M.right);
    const innerH = HEIGHT - M.top - M.bottom;
    const sx = (step: number) => M.left + ((step - x0) / (x1 - x0)) * innerW;
    const sy = (v: number) => M.top + (1 - (v - lo) / (hi - lo)) * innerH;
    const xs = drawn.map((p) => sx(p.step));
    return {
      drawn,
      smoothed,
      xs,
      sx,
      sy,
      line: pathOf(xs, smoothed.map(sy)),
      raw: smoothing > 0 ? pathOf(xs, values.map(sy)) : "",
      yTicks: niceTicks(lo, hi, 3).filter((t) => t >= lo && t <= hi),
      xTicks: niceTicks(x0, x1, Math.max(2, Math.floor(innerW / 80))).filter((t) => t >= x0 && t <= x1 && Number.isInteger(t)),
      innerW,
    };
  }, [points, smoothing, width]);

  const lastPoint = points[points.length - 1];
  const finiteValues = points.map((p) => p.value).filter(Number.isFinite);
  const summary =
    `${name}: ${points.length} points` +
    (lastPoint ? `, last ${formatMetric(lastPoint.value)} at step ${lastPoint.step}` : "") +
    (finiteValues.length ? `, min ${formatMetric(Math.min(...finiteValues))}, max ${formatMetric(Math.max(...finiteValues))}` : "");

  const nearest = (clientX: number, rect: DOMRect) => {
    const x = ((clientX - rect.left) / rect.width) * width;
    let best = 0;
    let dist = Infinity;
    view.xs.forEach((px, i) => {
      const d = Math.abs(px - x);
      if (d < dist) {
        dist = d;
        best = i;
      }
    });
    return best;
  };
  const onMove = (e: PointerEvent<SVGSVGElement>) => setCursor(nearest(e.clientX, e.currentTarget.getBoundingClientRect()));
  const onKey = (e: KeyboardEvent<SVGSVGElement>) => {
    const n = view.drawn.length;
    if (!n) return;
    const at = cursor ?? n - 1;
    const next =
      e.key === "ArrowLeft" ? Math.max(0, at - 1) : e.key === "ArrowRight" ? Math.min(n - 1, at + 1) : e.key === "Home" ? 0 : e.key === "End" ? n - 1 : null;
    if (next == null) return;
    e.preventDefault();
    setCursor(next);
  };

  const hover = cursor != null ? view.drawn[cursor] : undefined;
  const hoverSmoothed = cursor != null ? view.smoothed[cursor] : undefined;

  return (
    <figure className="chart" data-testid="metric-chart" data-metric={name} style={{ margin: 0 }}>
      <div className="chart-head">
        <figcaption className="chart-title">{name}</figcaption>
        <span className="chart-last" title={lastPoint ? `step ${lastPoint.step}` : undefined}>
          {lastPoint ? formatMetric(lastPoint.value) : "—"}
        </span>
      </div>
      <div ref={wrapRef}>
        <svg
          width={width}
          height={HEIGHT}
          viewBox={`0 0 ${width} ${HEIGHT}`}
          role="img"
          aria-label={summary}
          tabIndex={0}
          onPointerMove={onMove}
          onPointerLeave={() => setCursor(null)}
          onKeyDown={onKey}
          onBlur={() => setCursor(null)}
        >
          <g className="grid">
            {view.yTicks.map((t) => (
              <g key={`y${t}`}>
                <line x1={M.left} x2={M.left + view.innerW} y1={view.sy(t)} y2={view.sy(t)} />
                <text x={M.left - 6} y={view.sy(t) + 3} textAnchor="end">
                  {formatMetric(t)}
                </text>
              </g>
            ))}
            {view.xTicks.map((t) => (
              <text key={`x${t}`} x={view.sx(t)} y={HEIGHT - 5} textAnchor="middle">
                {t}
              </text>
            ))}
          </g>
          {view.raw ? <path className="raw" d={view.raw} /> : null}
          {view.drawn.length === 1 && view.drawn[0] ? (
            <circle className="dot" cx={view.xs[0]} cy={view.sy(view.drawn[0].value)} r={3} />
          ) : (
            <path className="line" d={view.line} />
          )}
          {hover && hoverSmoothed != null && Number.isFinite(hoverSmoothed) ? (
            <g>
              <line className="cursor" x1={view.xs[cursor as number]} x2={view.xs[cursor as number]} y1={M.top} y2={HEIGHT - M.bottom} />
              <circle className="dot" cx={view.xs[cursor as number]} cy={view.sy(hoverSmoothed)} r={3} />
            </g>
          ) : null}
        </svg>
      </div>
      <div className="chart-tip" aria-live="polite">
        {hover
          ? `step ${hover.step} · ${formatMetric(hover.value)}${smoothing > 0 && hoverSmoothed != null ? ` (smoothed ${formatMetric(hoverSmoothed)})` : ""} · ${formatClock(hover.time)}`
          : `${points.length} points${lastPoint ? ` · step ${lastPoint.step}` : ""}`}
      </div>
    </figure>
  );
}
