// A job's resource demand: the slot groups per role, colocation, nodes needed; slots named for their pool (GPUs, or
// CPU slots on a pool whose accelerator is "cpu").
import type { ResourceDemand } from "../../api/types";
import { slotNoun } from "../../lib/format";

export function DemandView({
  demand,
  accelerator,
}: {
  demand: ResourceDemand | null | undefined;
  accelerator?: string | null;
}) {
  if (!demand || !Array.isArray(demand.groups)) return <div className="muted">No demand computed.</div>;
  const slots = slotNoun(accelerator);
  return (
    <div>
      {demand.summary ? (
        <p className="mono" style={{ marginTop: 0 }}>
          {accelerator === "cpu" ? demand.summary.replace(/\bGPU(s?)\b/g, "CPU slot$1") : demand.summary}
        </p>
      ) : null}
      <dl className="facts" style={{ marginBottom: 10 }}>
        <div>
          <dt>Total {slots}</dt>
          <dd data-testid="demand-total">{demand.total_gpus}</dd>
        </div>
        <div>
          <dt>{slots} per node</dt>
          <dd>{demand.num_gpus_per_node}</dd>
        </div>
        <div>
          <dt>Nodes needed</dt>
          <dd>{demand.nodes_needed}</dd>
        </div>
        <div>
          <dt>Colocated</dt>
          <dd>{demand.colocated ? "yes" : "no"}</dd>
        </div>
        {demand.cpu_roles?.length ? (
          <div>
            <dt>CPU-only roles</dt>
            <dd>{demand.cpu_roles.join(", ")}</dd>
          </div>
        ) : null}
      </dl>
      <div className="table-wrap">
        <table>
          <caption className="sr-only">{slots} by role</caption>
          <thead>
            <tr>
              <th scope="col">Role</th>
              <th scope="col" className="num">Replicas</th>
              <th scope="col" className="num">{slots} / replica</th>
              <th scope="col">One node</th>
              <th scope="col">Shares with</th>
            </tr>
          </thead>
          <tbody>
            {demand.groups.map((g) => (
              <tr key={g.role}>
                <td>{g.role}</td>
                <td className="num">{g.replicas}</td>
                <td className="num">{g.gpus_per_replica}</td>
                <td>{g.one_node ? "yes" : "no"}</td>
                <td>{g.shares_with ?? "—"}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
    </div>
  );
}
