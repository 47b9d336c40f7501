// Placeholder while a query loads, announced to screen readers.
export function Loading({ label = "Loading…" }: { label?: string }) {
  return (
    <div className="row muted" role="status" aria-live="polite">
      <span className="spin" aria-hidden="true" /> {label}
    </div>
  );
}
