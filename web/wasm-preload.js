// The single-file page's WebAssembly, compiled while the browser is still reading the page.
//
// scripts/assemble-web.mjs moves the module's bytes (base64) out of the Emscripten glue into
// <script type="application/octet-stream" id="gpumem-wasm"> and runs this classic script right
// after it. The glue's own way, a 2.3 MB string literal the script parser reads and then a fetch
// of it as a data: URL, cost the page ~500 ms between its script starting and the module being
// ready (Chromium 156 on a 2-core machine: the data: URL decoded on the page's thread, and the
// compile only started after it); here the compile runs in the background while the rest of the
// page is parsed. wasm/gpumem.js's loadGpumem({ wasmModule }) instantiates the result, and
// web/engine.js hands the same compiled module to its workers (no second decode or compile).
//
// Sets globalThis.gpumemWasm = { module: Promise<WebAssembly.Module>, bytes: Uint8Array }; a
// failure rejects `module`, and loadGpumem reports it as the page's start failing.
'use strict';

(() => {
  const element = document.getElementById('gpumem-wasm');
  if (!element) return;
  const text = element.textContent.trim();
  // The text is needed once: the DOM need not keep 2.3 MB of it.
  element.remove();
  let bytes;
  let module;
  try {
    bytes = base64Bytes(text);
    module = WebAssembly.compile(bytes);
  } catch (error) {
    module = Promise.reject(error);
  }
  // Handled where it is used (loadGpumem); not an unhandled rejection while the page loads.
  module.catch(() => {});
  globalThis.gpumemWasm = { module, bytes };

  function base64Bytes(base64) {
    if (typeof Uint8Array.fromBase64 === 'function') return Uint8Array.fromBase64(base64);
    const binary = atob(base64);
    const out = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i += 1) out[i] = binary.charCodeAt(i);
    return out;
  }
})();
