// Pools (with their nodes) and queues: the capacity side of the platform.
import { queryOptions, useQuery } from "@tanstack/react-query";
import { api, unwrap } from "./client";
import { LIVE_REFRESH_MS } from "./jobs";

export const platformKeys = {
  all: ["platform"] as const,
  pools: () => [...platformKeys.all, "pools"] as const,
  queues: () => [...platformKeys.all, "queues"] as const,
};

export function poolsQuery() {
  return queryOptions({
    queryKey: platformKeys.pools(),
    queryFn: ({ signal }) => unwrap(api.GET("/v1/pools", { signal })).then((p) => p.data),
    refetchInterval: LIVE_REFRESH_MS,
  });
}

export function queuesQuery() {
  return queryOptions({
    queryKey: platformKeys.queues(),
    queryFn: ({ signal }) => unwrap(api.GET("/v1/queues", { signal })).then((p) => p.data),
    refetchInterval: LIVE_REFRESH_MS,
    staleTime: 30_000,
  });
}

/** Each pool's accelerator by pool name ("cpu" for CPU slots), from the pools query (empty until it loads). */
export function usePoolAccelerators(): ReadonlyMap<string, string> {
  const pools = useQuery(poolsQuery());
  const out = new Map<string, string>();
  for (const p of pools.data ?? []) out.set(p.name, String(p.accelerator ?? ""));
  return out;
}
