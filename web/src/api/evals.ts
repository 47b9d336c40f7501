// CI evals (`/v1/evals`): the query-key factory and query options.
//
//   evalKeys.all              ["evals"]
//   evalKeys.list(model)      ["evals", "list", model | null]   every eval, or one model's history
//   evalKeys.detail(id)       ["evals", "detail", id]
// Evals are created by CI (`relaxctl eval`), not here: the lists poll while one is running.
import { queryOptions } from "@tanstack/react-query";
import { api, type Schemas, unwrap } from "./client";
import { LIVE_REFRESH_MS } from "./jobs";

export type EvalPublic = Schemas["EvalPublic"];

export const evalKeys = {
  all: ["evals"] as const,
  lists: () => [...evalKeys.all, "list"] as const,
  list: (model: string | null) => [...evalKeys.lists(), model?.trim() || null] as const,
  detail: (id: string) => [...evalKeys.all, "detail", id] as const,
};

/** Up to 500 evals, newest first: every model's (model null) or one model's history. */
export function evalsQuery(model: string | null) {
  const key = evalKeys.list(model);
  return queryOptions({
    queryKey: key,
    queryFn: ({ signal }) =>
      unwrap(
        api.GET("/v1/evals", { params: { query: { limit: 500, ...(key[2] ? { model: key[2] } : {}) } }, signal }),
      ).then((page) => page.data),
    refetchInterval: (q) => ((q.state.data ?? []).some((e) => e.outcome === "running") ? LIVE_REFRESH_MS : false),
  });
}
