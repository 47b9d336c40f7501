// The generated types must be what openapi-typescript makes of the committed OpenAPI schema
// (gen/openapi.json itself is compared with the live API by tests/browser/test_generated_client.py).
import { readFileSync } from "node:fs";
import { join } from "node:path";
import openapiTS, { astToString } from "openapi-typescript";
import { describe, expect, it } from "vitest";

const GEN = join(__dirname, "..", "..", "src", "api", "gen");

describe("generated API client (src/api/gen)", () => {
  it("schema.ts is up to date with openapi.json (run `npm run gen-api`)", async () => {
    const schema = JSON.parse(readFileSync(join(GEN, "openapi.json"), "utf8"));
    const expected = astToString(await openapiTS(schema, { enumValues: true })); // as scripts/gen-api.sh runs it
    const committed = readFileSync(join(GEN, "schema.ts"), "utf8");
    const body = (s: string) => s.slice(s.indexOf("export interface paths"));
    expect(body(committed).trim()).toBe(body(expected).trim());
  }, 30_000);

  it("says it must not be edited by hand", () => {
    expect(readFileSync(join(GEN, "schema.ts"), "utf8").split("\n")[0]).toContain("DO NOT EDIT");
  });
});
