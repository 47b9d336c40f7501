// Pools (nodes with GPUs allocated) and queues (used against nominal quota): where capacity is.
import { useQuery } from "@tanstack/react-query";
import { poolsQuery, queuesQuery } from "../api/platform";
import { Bar } from "../components/common/Bar";
import { DataTable } from "../components/common/DataTable";
import { ErrorPanel } from "../components/common/ErrorPanel";
import { Loading } from "../components/common/Loading";
import { PageHead } from "../components/common/PageHead";
import { SLOT_HOLDING_STATUSES } from "../api/types";
import { buildHash } from "../lib/router";

function nodeState(n: { alive: boolean; cordoned: boolean }): { text: string; cls: string } {
  if (!n.alive) return { text: "down", cls: "FAILED" };
  if (n.cordoned) return { text: "cordoned", cls: "CANCELLING" };
  return { text: "ready", cls: "SUCCEEDED" };
}

export function PlatformPage() {
  const pools = useQuery(poolsQuery());
  const queues = useQuery(queuesQuery());
  return (
    <div>
      <PageHead title="Pools & queues">
        <span className="muted small">refreshes every 5 s</span>
      </PageHead>

      <h2>Pools</h2>
      {pools.isPending ? <Loading /> : null}
      {pools.isError ? <ErrorPanel error={pools.error} /> : null}
      {pools.data?.map((p) => (
        <section key={p.name} className="panel" aria-labelledby={`pool-${p.name}`} data-testid="pool">
          <div className="row" style={{ justifyContent: "space-between" }}>
            <h3 id={`pool-${p.name}`} style={{ margin: 0 }}>
              {p.name} <span className="muted small">({p.accelerator})</span>
              {p.cordoned ? <span className="status status-CANCELLING" style={{ marginLeft: 8 }}>cordoned</span> : null}
            </h3>
            <span className="small">
              <a href={buildHash(["jobs"], { status: SLOT_HOLDING_STATUSES })}>
                {p.jobs_holding_slots} holding slots
              </a>
              {" · "}
              <a href={buildHash(["jobs"], { status: ["QUEUED"] })}>{p.jobs_queued} queued</a>
            </span>
          </div>
          <div className="row" style={{ margin: "8px 0 12px" }}>
            <span className="nowrap">
              {p.allocated_gpus} / {p.total_gpus} {p.accelerator === "cpu" ? "slots" : "GPUs"} allocated
            </span>
            <div style={{ flex: 1, maxWidth: 400 }}>
              <Bar value={p.allocated_gpus} max={p.total_gpus} label={`${p.name} allocation`} />
            </div>
          </div>
          {p.ray_address ? (
            <div className="muted small" style={{ marginBottom: 8 }}>
              Ray: <code>{p.ray_address}</code>
            </div>
          ) : null}
          <DataTable
            caption={<>Nodes of {p.name}</>}
            head={
              <>
                <th scope="col">Node</th>
                <th scope="col">State</th>
                <th scope="col" className="num">Allocated</th>
                <th scope="col" style={{ width: "30%" }}>
                  Usage
                </th>
                <th scope="col">Jobs</th>
                <th scope="col">Labels</th>
              </>
            }
          >
            {p.nodes.map((n) => {
              const st = nodeState(n);
              return (
                <tr key={n.name}>
                  <td className="mono">{n.name}</td>
                  <td>
                    <span className={`status status-${st.cls}`}>{st.text}</span>
                  </td>
                  <td className="num">
                    {n.allocated_gpus} / {n.gpus}
                  </td>
                  <td>
                    <Bar value={n.allocated_gpus} max={n.gpus} label={`${n.name} usage`} />
                  </td>
                  <td className="mono small">
                    {(n.jobs ?? []).length || n.other_gpus
                      ? (n.jobs ?? []).map((j, i) => (
                          <span key={j.job_id}>
                            {i ? ", " : null}
                            <a href={buildHash(["jobs", j.job_id])}>{j.job_id}</a> ({j.gpus})
                          </span>
                        ))
                      : "—"}
                    {n.other_gpus ? (
                      <span className="muted" data-testid="other-gpus">
                        {(n.jobs ?? []).length ? ", " : null}other teams ({n.other_gpus})
                      </span>
                    ) : null}
                  </td>
                  <td className="mono small">
                    {Object.entries(n.labels ?? {})
                      .map(([k, v]) => `${k}=${v}`)
                      .join(", ") || "—"}
                  </td>
                </tr>
              );
            })}
          </DataTable>
        </section>
      ))}

      <h2 style={{ marginTop: 22 }}>Queues</h2>
      {queues.isPending ? <Loading /> : null}
      {queues.isError ? <ErrorPanel error={queues.error} /> : null}
      {queues.data ? (
        <DataTable
          panel
          testId="queues"
          caption="Queues"
          head={
            <>
              <th scope="col">Queue</th>
              <th scope="col">Team</th>
              <th scope="col">Pool</th>
              <th scope="col" className="num">Used / nominal</th>
              <th scope="col" style={{ width: "22%" }}>
                Quota
              </th>
              <th scope="col" className="num">Borrow limit</th>
              <th scope="col" className="num">Lend limit</th>
              <th scope="col" className="num">Weight</th>
              <th scope="col" className="num">Running</th>
              <th scope="col" className="num">Queued jobs (GPUs)</th>
            </>
          }
        >
          {queues.data.map((q) => (
            <tr key={q.name}>
              <td>
                <a href={buildHash(["jobs"], { queue: q.name })}>{q.name}</a>
              </td>
              <td>{q.team}</td>
              <td>{q.pool}</td>
              <td className="num">
                {q.used_gpus} / {q.nominal_gpus}
              </td>
              <td>
                <Bar value={q.used_gpus} max={q.nominal_gpus} label={`${q.name} quota use`} />
                {q.borrowed_gpus > 0 ? <span className="small muted">borrowing {q.borrowed_gpus}</span> : null}
              </td>
              <td className="num">{q.borrowing_limit ?? "none"}</td>
              <td className="num">{q.lending_limit ?? "none"}</td>
              <td className="num">{q.weight}</td>
              <td className="num">{q.running_jobs}</td>
              <td className="num">
                {q.queued_jobs ? (
                  <a href={buildHash(["jobs"], { queue: q.name, status: ["QUEUED"] })}>
                    {q.queued_jobs} ({q.queued_gpus})
                  </a>
                ) : (
                  0
                )}
              </td>
            </tr>
          ))}
        </DataTable>
      ) : null}
    </div>
  );
}
