// Entry point: take a key handed over in the URL, set up the query client, render the app.
import { QueryClient, QueryClientProvider } from "@tanstack/react-query";
import { StrictMode } from "react";
import { createRoot } from "react-dom/client";
import { ApiError } from "./api/client";
import { App } from "./App";
import { adoptKeyFromLocation } from "./lib/auth";
import "./styles.css";

adoptKeyFromLocation();
window.addEventListener("hashchange", adoptKeyFromLocation);

/** Retry what may pass on a second try (network, 5xx), never what will fail the same way (4xx). */
function retry(failures: number, error: unknown): boolean {
  if (error instanceof ApiError && error.status >= 400 && error.status < 500) return false;
  return failures < 2;
}

const queryClient = new QueryClient({
  defaultOptions: {
    queries: { retry, staleTime: 2_000, refetchOnWindowFocus: true },
    mutations: { retry: false },
  },
});

const root = document.getElementById("root");
if (!root) throw new Error("index.html has no #root");
createRoot(root).render(
  <StrictMode>
    <QueryClientProvider client={queryClient}>
      <App />
    </QueryClientProvider>
  </StrictMode>,
);
