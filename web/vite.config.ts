/// <reference types="vitest/config" />
// Vite builds the dashboard into dist/ (served by the API at /); `npm run dev` proxies the API.
import react from "@vitejs/plugin-react";
import { defineConfig } from "vite";

// The platform the dev server talks to (`make run` listens on 8400).
const API = process.env.RELAX_URL ?? "http://127.0.0.1:8400";

export default defineConfig({
  plugins: [react()],
  // Relative asset URLs: the built files work wherever the API mounts them.
  base: "./",
  build: {
    outDir: "dist",
    emptyOutDir: true,
    sourcemap: false,
    chunkSizeWarningLimit: 400,
  },
  server: {
    port: 5173,
    // The example spec that prefills the Submit page lives in ../examples.
    fs: { allow: [".."] },
    proxy: {
      "/v1": { target: API, changeOrigin: false },
      "/healthz": API,
      "/readyz": API,
      "/docs": API,
      "/openapi.json": API,
    },
  },
  test: {
    include: ["tests/unit/**/*.test.ts"],
    environment: "node",
  },
});
