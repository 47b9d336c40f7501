// Specs: the dry run behind the Submit page's "Validate".
import { useMutation } from "@tanstack/react-query";
import { api, unwrap } from "./client";
import type { SpecValidate } from "./types";

export function useValidateSpec() {
  return useMutation({
    mutationKey: ["specs", "validate"],
    mutationFn: (body: SpecValidate) => unwrap(api.POST("/v1/specs/validate", { body })),
  });
}
