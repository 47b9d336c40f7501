import { describe, expect, it } from "vitest";
import { readSse, SseParser, type SseMessage } from "../../src/lib/sse";

const all = (chunks: string[]): SseMessage[] => {
  const p = new SseParser();
  return chunks.flatMap((c) => p.push(c));
};

describe("SSE parser (SseParser)", () => {
  it("parses one named event with JSON data", () => {
    expect(all(['event: status\ndata: {"status":"RUNNING"}\n\n'])).toEqual([
      { event: "status", data: '{"status":"RUNNING"}', id: "" },
    ]);
  });

  it("defaults the event name to 'message'", () => {
    expect(all(["data: hi\n\n"])[0]?.event).toBe("message");
  });

  it("joins several data lines with a newline", () => {
    expect(all(["data: a\ndata: b\ndata:\n\n"])[0]?.data).toBe("a\nb\n");
  });

  it("ignores comments such as the keep-alive", () => {
    expect(all([": keep-alive\n\n", "event: end\ndata: {}\n\n"])).toEqual([{ event: "end", data: "{}", id: "" }]);
  });

  it("does not dispatch a message without data", () => {
    expect(all(["event: status\n\n"])).toEqual([]);
  });

  it("strips only the first space after the colon", () => {
    expect(all(["data:  two spaces\n\n"])[0]?.data).toBe(" two spaces");
    expect(all(["data:none\n\n"])[0]?.data).toBe("none");
  });

  it("accepts CRLF, CR and LF line endings", () => {
    expect(all(["event: a\r\ndata: 1\r\n\r\nevent: b\rdata: 2\r\revent: c\ndata: 3\n\n"]).map((m) => m.event)).toEqual(["a", "b", "c"]);
  });

  it("keeps a CRLF split across two chunks as one line end", () => {
    expect(all(["data: x\r", "\n\r", "\n"])).toEqual([{ event: "message", data: "x", id: "" }]);
  });

  it("reassembles messages split at every possible point", () => {
    const stream = 'event: metric\ndata: {"name":"rollout/reward","step":3,"value":0.5}\n\nevent: log\ndata: {"id":7}\n\n';
    for (let cut = 0; cut <= stream.length; cut++) {
      const msgs = all([stream.slice(0, cut), stream.slice(cut)]);
      expect(msgs.map((m) => m.event), `cut at ${cut}`).toEqual(["metric", "log"]);
    }
    // and one character at a time
    expect(all([...stream]).map((m) => JSON.parse(m.data))).toEqual([{ name: "rollout/reward", step: 3, value: 0.5 }, { id: 7 }]);
  });

  it("remembers the last event id and the retry delay", () => {
    const p = new SseParser();
    const msgs = p.push("id: 41\nretry: 3000\ndata: a\n\ndata: b\n\n");
    expect(msgs.map((m) => m.id)).toEqual(["41", "41"]);
    expect(p.retryMs).toBe(3000);
  });

  it("drops an unterminated last message at the end of the stream", () => {
    const p = new SseParser();
    expect(p.push("data: complete\n\ndata: partial")).toHaveLength(1);
    p.end();
    expect(p.push("\n\n")).toEqual([]);
  });
});

describe("SSE over a byte stream (readSse)", () => {
  it("decodes UTF-8 characters split across network chunks", async () => {
    const bytes = new TextEncoder().encode('event: log\ndata: {"message":"größe ✓ 模型"}\n\n');
    // Cut inside the multi-byte characters.
    const chunks = [bytes.slice(0, 30), bytes.slice(30, 31), bytes.slice(31, 45), bytes.slice(45)];
    const body = new ReadableStream<Uint8Array>({
      start(c) {
        for (const ch of chunks) c.enqueue(ch);
        c.close();
      },
    });
    const got: SseMessage[] = [];
    await readSse(body, (m) => got.push(m));
    expect(JSON.parse(got[0]?.data ?? "{}").message).toBe("größe ✓ 模型");
  });

  it("stops reading when aborted", async () => {
    const encoder = new TextEncoder();
    let pulls = 0;
    const body = new ReadableStream<Uint8Array>({
      pull(c) {
        pulls++;
        c.enqueue(encoder.encode(`data: ${pulls}\n\n`));
      },
    });
    const abort = new AbortController();
    const got: string[] = [];
    await readSse(
      body,
      (m) => {
        got.push(m.data);
        if (got.length === 3) abort.abort();
      },
      abort.signal,
    );
    expect(got).toEqual(["1", "2", "3"]);
  });
});
