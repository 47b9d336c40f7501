// Names for the generated schema types the dashboard uses. Hand-written only where the API returns
// untyped objects (`dict[str, Any]`): pools, queues, the resource demand, spec issues.
import type { FieldIssue, Schemas } from "./client";

export type Job = Schemas["JobPublic"];
export type JobDetail = Schemas["JobDetail"];
export type JobsPage = Schemas["JobsPage"];
export type JobEvent = Schemas["JobEventPublic"];
export type MetricPoint = Schemas["MetricPoint"];
export type LogLine = Schemas["LogLinePublic"];
export type Checkpoint = Schemas["CheckpointPublic"];
export type Rollout = Schemas["RolloutPublic"];
export type JobCreate = Schemas["JobCreate"];
export type SpecValidate = Schemas["SpecValidate"];
export type SpecValidation = Schemas["SpecValidation"];

/** The job states (DESIGN.md §2), in the order a job moves through them. */
export const JOB_STATUSES = [
  "QUEUED",
  "ADMITTED",
  "STARTING",
  "RUNNING",
  "PREEMPTING",
  "CANCELLING",
  "SUCCEEDED",
  "FAILED",
  "CANCELLED",
] as const;
export type JobStatus = (typeof JOB_STATUSES)[number];

/** `GET /v1/pools` items (typed as free objects by the API). */
export interface PoolNode {
  name: string;
  gpus: number;
  allocated_gpus: number;
  /** Jobs holding GPUs on this node (for a team's key: only the team's own). */
  jobs: { job_id: string; gpus: number }[];
  /** GPUs held here by jobs not listed: other teams' jobs, which a team's key does not see. */
  other_gpus?: number;
  labels: Record<string, string>;
  cordoned: boolean;
  alive: boolean;
}

export interface Pool {
  name: string;
  accelerator: string;
  /** Only admins see it (null for a team's key). */
  ray_address: string | null;
  cordoned: boolean;
  total_gpus: number;
  allocated_gpus: number;
  jobs_holding_slots: number;
  jobs_queued: number;
  nodes: PoolNode[];
}

/** `GET /v1/queues` items (typed as free objects by the API). */
export interface Queue {
  name: string;
  pool: string;
  team: string;
  nominal_gpus: number;
  borrowing_limit: number | null;
  lending_limit: number | null;
  weight: number;
  used_gpus: number;
  borrowed_gpus: number;
  running_jobs: number;
  queued_jobs: number;
  queued_gpus: number;
}

/** One GPU group of a job's resource demand (jobspec.demand.GpuGroup). */
export interface GpuGroup {
  role: string;
  replicas: number;
  gpus_per_replica: number;
  one_node: boolean;
  shares_with: string | null;
}

export interface ResourceDemand {
  groups: GpuGroup[];
  total_gpus: number;
  num_gpus_per_node: number;
  colocated: boolean;
  nodes_needed: number;
  cpu_roles: string[];
  summary: string;
}

export type SpecIssue = FieldIssue;
