// Test inputs shared by the JS API tests and the browser tests (not a test file itself).

// GPT-2 (124M)'s checkpoint as a safetensors header: Hugging Face's tensor names and shapes
// (openai-community/gpt2's model.safetensors, without its attention-mask buffers), fp32, the
// tied head stored once. 2 + 12 × 12 + 2 = 148 tensors, 124,439,808 elements.
export function gpt2SafetensorsHeader() {
  const tensors = [['wte.weight', [50257, 768]], ['wpe.weight', [1024, 768]]];
  for (let i = 0; i < 12; i++) {
    const h = `h.${i}`;
    tensors.push(
      [`${h}.ln_1.weight`, [768]], [`${h}.ln_1.bias`, [768]],
      [`${h}.attn.c_attn.weight`, [768, 2304]], [`${h}.attn.c_attn.bias`, [2304]],
      [`${h}.attn.c_proj.weight`, [768, 768]], [`${h}.attn.c_proj.bias`, [768]],
      [`${h}.ln_2.weight`, [768]], [`${h}.ln_2.bias`, [768]],
      [`${h}.mlp.c_fc.weight`, [768, 3072]], [`${h}.mlp.c_fc.bias`, [3072]],
      [`${h}.mlp.c_proj.weight`, [3072, 768]], [`${h}.mlp.c_proj.bias`, [768]],
    );
  }
  tensors.push(['ln_f.weight', [768]], ['ln_f.bias', [768]]);
  const header = { __metadata__: { format: 'pt' } };
  let offset = 0;
  let elements = 0;
  for (const [name, shape] of tensors) {
    const n = shape.reduce((a, b) => a * b, 1);
    header[name] = { dtype: 'F32', shape, data_offsets: [offset, offset + 4 * n] };
    offset += 4 * n;
    elements += n;
  }
  return { header, text: JSON.stringify(header), tensorCount: tensors.length, parameterCount: elements, dataBytes: offset };
}

// The first bytes of a .safetensors file: the header's length as a little-endian u64, then the
// header. The tensor data that would follow is left out: readers only need the header.
export function safetensorsFileStart(headerText) {
  const json = Buffer.from(headerText, 'utf8');
  const length = Buffer.alloc(8);
  length.writeBigUInt64LE(BigInt(json.length));
  return Buffer.concat([length, json]);
}

// A model.safetensors.index.json for a two-shard Llama-2-7B checkpoint (names abridged).
export function llamaIndex() {
  const weightMap = { 'model.embed_tokens.weight': 'model-00001-of-00002.safetensors', 'lm_head.weight': 'model-00002-of-00002.safetensors' };
  for (let i = 0; i < 32; i++) weightMap[`model.layers.${i}.mlp.down_proj.weight`] = `model-0000${i < 16 ? 1 : 2}-of-00002.safetensors`;
  return { metadata: { total_size: 13476839424 }, weight_map: weightMap };
}
