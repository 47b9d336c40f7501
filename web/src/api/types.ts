// Names for the generated schema types the dashboard uses: aliases only. Every type is declared once, in the
// API's Python (docs/adr/0008), and reaches here through `npm run gen-api` (gen/schema.ts); a type the API
// does not declare is not written here either (a test fails on an interface or a hand-written list).
import { jobStatusValues, slotHoldingJobStatusValues, terminalJobStatusValues } from "./gen/schema";
import type { Schemas } from "./client";

export type Job = Schemas["JobPublic"];
export type JobDetail = Schemas["JobDetail"];
export type JobsPage = Schemas["JobsPage"];
export type JobEvent = Schemas["JobEventPublic"];
export type JobStatus = Schemas["JobStatus"];
export type TerminalJobStatus = Schemas["TerminalJobStatus"];
export type SlotHoldingJobStatus = Schemas["SlotHoldingJobStatus"];
export type FailureReason = Schemas["FailureReason"];
export type Allocation = Schemas["AllocationPublic"];
export type MetricPoint = Schemas["MetricPoint"];
export type LogLine = Schemas["LogLinePublic"];
export type Checkpoint = Schemas["CheckpointPublic"];
export type Rollout = Schemas["RolloutPublic"];
export type JobCreate = Schemas["JobCreate"];
export type SpecValidate = Schemas["SpecValidate"];
export type SpecValidation = Schemas["SpecValidation"];
export type SpecIssue = Schemas["SpecIssue"];
export type ResourceDemand = Schemas["ResourceDemand"];
export type GpuGroup = Schemas["GpuGroup"];
export type Capacity = Schemas["Capacity"];
export type Pool = Schemas["PoolPublic"];
export type PoolNode = Schemas["NodePublic"];
export type Queue = Schemas["QueuePublic"];

/** The job states in the order `wire.jobs.JobStatus` declares them (the generated enum). */
export const JOB_STATUSES: readonly JobStatus[] = jobStatusValues;
/** The states a job ends in: `wire.jobs.TERMINAL`, in the order of `JOB_STATUSES` (the generated enum). */
export const TERMINAL_STATUSES: readonly TerminalJobStatus[] = terminalJobStatusValues;
/** The states in which a job holds its slots on a pool: `wire.jobs.HOLDING_SLOTS` (the generated enum). */
export const SLOT_HOLDING_STATUSES: readonly SlotHoldingJobStatus[] = slotHoldingJobStatusValues;
