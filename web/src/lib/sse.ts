// Server-sent events over fetch: EventSource cannot send an Authorization header, so the dashboard
// reads `text/event-stream` bodies itself. The parser follows the WHATWG "event stream
// interpretation" rules: lines end in CRLF, LF or CR; a blank line dispatches; `:` starts a comment;
// several `data:` lines join with "\n"; a message without data is not dispatched.

export interface SseMessage {
  /** `event:` field; "message" when the server sent none. */
  event: string;
  /** The `data:` lines joined with "\n". */
  data: string;
  /** The last `id:` seen on the stream so far (the spec's "last event ID"). */
  id: string;
}

/** Incremental parser: feed it decoded text in chunks of any size, get back whole messages. */
export class SseParser {
  private buffer = "";
  private pendingCR = false;
  private eventType = "";
  private dataLines: string[] = [];
  private lastId = "";
  /** Set by `retry:`; the reconnect delay the server asks for, in ms. */
  retryMs: number | null = null;

  push(chunk: string): SseMessage[] {
    const out: SseMessage[] = [];
    let text = chunk;
    // A CR that ended the previous chunk may be the first half of a CRLF.
    if (this.pendingCR) {
      this.pendingCR = false;
      if (text.startsWith("\n")) text = text.slice(1);
    }
    this.buffer += text;
    let start = 0;
    for (let i = 0; i < this.buffer.length; i++) {
      const c = this.buffer.charCodeAt(i);
      if (c !== 10 && c !== 13) continue;
      const line = this.buffer.slice(start, i);
      if (c === 13) {
        if (i + 1 < this.buffer.length) {
          if (this.buffer.charCodeAt(i + 1) === 10) i++;
        } else {
          this.pendingCR = true;
        }
      }
      start = i + 1;
      const msg = this.line(line);
      if (msg) out.push(msg);
    }
    this.buffer = this.buffer.slice(start);
    return out;
  }

  /** End of stream: a trailing message without its blank line is dropped, as the spec says. */
  end(): void {
    this.buffer = "";
    this.pendingCR = false;
    this.eventType = "";
    this.dataLines = [];
  }

  private line(line: string): SseMessage | null {
    if (line === "") return this.dispatch();
    if (line.startsWith(":")) return null;
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (field) {
      case "event":
        this.eventType = value;
        break;
      case "data":
        this.dataLines.push(value);
        break;
      case "id":
        if (!value.includes("\0")) this.lastId = value;
        break;
      case "retry":
        if (/^\d+$/.test(value)) this.retryMs = Number(value);
        break;
      default:
        break; // unknown fields are ignored
    }
    return null;
  }

  private dispatch(): SseMessage | null {
    const hasData = this.dataLines.length > 0;
    const msg = { event: this.eventType || "message", data: this.dataLines.join("\n"), id: this.lastId };
    this.eventType = "";
    this.dataLines = [];
    return hasData ? msg : null;
  }
}

/**
 * Read a fetch body as server-sent events until it ends or `signal` aborts. Bytes are decoded as
 * UTF-8 in streaming mode, so a character split across two network chunks stays whole.
 */
export async function readSse(
  body: ReadableStream<Uint8Array>,
  onMessage: (msg: SseMessage) => void,
  signal?: AbortSignal,
): Promise<void> {
  const reader = body.getReader();
  const decoder = new TextDecoder("utf-8");
  const parser = new SseParser();
  const cancel = () => void reader.cancel().catch(() => undefined);
  signal?.addEventListener("abort", cancel, { once: true });
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      for (const msg of parser.push(decoder.decode(value, { stream: true }))) onMessage(msg);
      if (signal?.aborted) break;
    }
    for (const msg of parser.push(decoder.decode())) onMessage(msg);
    parser.end();
  } finally {
    signal?.removeEventListener("abort", cancel);
    reader.releaseLock();
  }
}
