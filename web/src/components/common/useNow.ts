// The current time, re-read every `ms`: durations of running jobs tick without refetching.
import { useEffect, useState } from "react";

export function useNow(ms = 1_000): number {
  const [now, setNow] = useState(() => Date.now());
  useEffect(() => {
    const t = setInterval(() => setNow(Date.now()), ms);
    return () => clearInterval(t);
  }, [ms]);
  return now;
}
