"""SGLang's native HTTP protocol in the runtime: the built-in engine's server (`server`), the client
(`client`), the rollout-engine adapters and launcher (`engine_actor`), and the wire schemas (`protocol`,
`tensor_payload`). See docs/reference/runtime.md, "SGLang protocol"."""
