// A job status as a coloured pill; the text is always there, so colour is never the only signal.
export function StatusBadge({ status }: { status: string }) {
  return <span className={`status status-${status}`}>{status}</span>;
}
