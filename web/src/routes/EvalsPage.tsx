// CI evals: each model's eval history (`#/evals`), and one model's verdicts and metrics over time
// (`#/evals?model=<model_key>`). Evals are run by CI with `relaxctl eval --wait --junit`.
import { useQuery } from "@tanstack/react-query";
import { type EvalPublic, evalsQuery } from "../api/evals";
import { DataTable } from "../components/common/DataTable";
import { ErrorPanel } from "../components/common/ErrorPanel";
import { Loading } from "../components/common/Loading";
import { PageHead } from "../components/common/PageHead";
import { MetricChart } from "../components/jobs/MetricChart";
import { describeThreshold, groupByModel, metricSeries, verdictClass } from "../lib/evals";
import { formatMetric, formatTime } from "../lib/format";
import { buildHash, type Route } from "../lib/router";

function Outcome({ outcome }: { outcome: string }) {
  return <span className={`status status-${verdictClass(outcome)}`}>{outcome}</span>;
}

export function EvalsPage({ route }: { route: Route }) {
  const model = route.query.get("model");
  return model ? <ModelHistoryView model={model} /> : <ModelsView />;
}

function ModelsView() {
  const evals = useQuery(evalsQuery(null));
  const models = groupByModel(evals.data ?? []);
  return (
    <div>
      <PageHead title="Evals">
        <span className="muted small">
          run by CI: <code>relaxctl eval … --wait --junit out.xml</code>
        </span>
      </PageHead>
      {evals.isPending ? <Loading /> : null}
      {evals.isError ? <ErrorPanel error={evals.error} /> : null}
      {evals.data && !models.length ? <p className="muted">No eval yet.</p> : null}
      {models.length ? (
        <DataTable
          panel
          testId="eval-models"
          caption="Models and their latest eval"
          head={
            <>
              <th scope="col">Model</th>
              <th scope="col">Latest</th>
              <th scope="col">Thresholds</th>
              <th scope="col" className="num">Passed</th>
              <th scope="col" className="num">Failed</th>
              <th scope="col" className="num">Error</th>
              <th scope="col">When</th>
            </>
          }
        >
          {models.map((m) => (
            <tr key={m.model}>
              <td className="mono">
                <a href={buildHash(["evals"], { model: m.model })}>{m.model}</a>
              </td>
              <td>
                <Outcome outcome={m.latest.outcome} />
              </td>
              <td className="small">{m.latest.thresholds.map(describeThreshold).join("; ")}</td>
              <td className="num">{m.counts.passed}</td>
              <td className="num">{m.counts.failed}</td>
              <td className="num">{m.counts.error}</td>
              <td className="nowrap small">{formatTime(m.latest.created_at)}</td>
            </tr>
          ))}
        </DataTable>
      ) : null}
    </div>
  );
}

function ModelHistoryView({ model }: { model: string }) {
  const evals = useQuery(evalsQuery(model));
  const history: EvalPublic[] = groupByModel(evals.data ?? [])[0]?.evals ?? [];
  const series = metricSeries(history);
  const names = Object.keys(series).sort();
  const stepOf = (ev: EvalPublic) => ev.model.step ?? null;
  const withSteps = history.some((ev) => stepOf(ev) !== null); // a job's exports and checkpoints
  return (
    <div>
      <PageHead
        title={
          <>
            Evals of <code>{model}</code>
          </>
        }
      >
        <a href={buildHash(["evals"])}>All models</a>
      </PageHead>
      {evals.isPending ? <Loading /> : null}
      {evals.isError ? <ErrorPanel error={evals.error} /> : null}
      {evals.data && !history.length ? <p className="muted">No eval of this model.</p> : null}
      {names.length ? (
        <section className="panel" aria-label="Metrics over time">
          <h2 style={{ marginTop: 0 }}>Metrics over its evals (oldest left)</h2>
          <div className="charts">
            {names.map((name) => (
              <MetricChart key={name} name={name} points={series[name] ?? []} smoothing={0} />
            ))}
          </div>
        </section>
      ) : null}
      {history.length ? (
        <DataTable
          panel
          testId="eval-history"
          caption={<>Evals of {model}, newest first</>}
          head={
            <>
              <th scope="col">When</th>
              <th scope="col">Eval</th>
              {withSteps ? <th scope="col" className="num">Step</th> : null}
              <th scope="col">Verdict</th>
              <th scope="col">Thresholds</th>
              <th scope="col">Metrics</th>
              <th scope="col">Job</th>
            </>
          }
        >
          {[...history].reverse().map((ev) => (
            <tr key={ev.id}>
              <td className="nowrap small">{formatTime(ev.created_at)}</td>
              <td>
                {ev.name} <span className="muted small mono">{ev.id}</span>
              </td>
              {withSteps ? <td className="num">{stepOf(ev) ?? "—"}</td> : null}
              <td>
                <Outcome outcome={ev.outcome} />
                {ev.reason ? <div className="muted small">{ev.reason}</div> : null}
              </td>
              <td className="small">
                {ev.thresholds.map((t) => (
                  <div key={`${t.metric}${t.op}${t.value}`}>
                    <span className={`status status-${t.verdict === "pass" ? "SUCCEEDED" : t.verdict === "pending" ? "QUEUED" : "FAILED"}`}>
                      {t.verdict}
                    </span>{" "}
                    {describeThreshold(t)}
                  </div>
                ))}
              </td>
              <td className="small mono">
                {Object.entries(ev.metric_values)
                  .filter(([name]) => !name.includes("/", "eval/".length))
                  .map(([name, value]) => `${name}=${formatMetric(value)}`)
                  .join(", ") || "—"}
              </td>
              <td className="mono small">
                <a href={buildHash(["jobs", ev.job_id])}>{ev.job_id}</a>
              </td>
            </tr>
          ))}
        </DataTable>
      ) : null}
    </div>
  );
}
