// Where a setup comes from: the address (shared links), defaults, examples, files.
//
// Split out of app.js by panel; every byte it shows comes from the core's estimate.

import { downloadBlob } from './exports.js';
import { LONG_SETUP_CHARS, deflateSetupText, encodeSetupParam, fromBase64Url, inflateSetupText, setupFromParams, toBase64Url } from './setup-params.js';
import { update } from './app.js';
import { loadCompareFrom } from './compare-panel.js';
import { errorText, errorsOf, fieldLabel } from './errors.js';
import { gpuById, listedGpuOf, setUnits } from './gpu-panel.js';
import { renderLayers } from './layers-panel.js';
import { presetById } from './model-panel.js';
import { firstVisitSetup } from './first-screen.js';
import { $, $$, state } from './page-state.js';
import { currentKind, fillForm, isPlainObject, mergeSetup, readForm, setSelectValue, showKindPanels } from './setup-form.js';

// ---------- URL state ----------

// The setup from "#s=<base64url of the JSON>" (or of URI-encoded JSON, for hand-written
// links), or from "#z=" (compressed; `inflated`: its JSON text, or the error inflating it);
// null when the hash holds none; throws when it holds one that cannot be read.
function setupFromHash(hash, inflated) {
  if (inflated instanceof Error) throw inflated;
  if (typeof inflated === 'string') return JSON.parse(inflated);
  const value = new URLSearchParams(hash.replace(/^#/, '')).get('s');
  if (!value) return null;
  const text = value.trimStart().startsWith('{') ? value : fromBase64Url(value);
  return JSON.parse(text);
}

// A link's checksum: FNV-1a (32 bit) of everything before "&c=", in base 36. It is the last
// parameter, so a link cut anywhere (chat apps cut long links) either loses it or no longer
// matches it.
export function linkChecksum(text) {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h.toString(36);
}

function sameJson(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

// Only the leaves that differ from `base` (arrays and values compared whole); undefined when
// nothing differs.
function differences(value, base) {
  if (!isPlainObject(value) || !isPlainObject(base)) return sameJson(value, base) ? undefined : value;
  const out = {};
  for (const [key, v] of Object.entries(value)) {
    const d = key in base ? differences(v, base[key]) : v;
    if (d !== undefined) out[key] = d;
  }
  return Object.keys(out).length ? out : undefined;
}

// The short form of a setup for a link: what differs from the core's DefaultSetup (the core
// fills absent fields with it), a preset by its id alone while the fields hold exactly its
// architecture, a listed GPU by its id alone while the size is its own. The version tag in the
// link says which core's defaults and presets it was written against.
export function shortSetup(setup) {
  const defaults = state.options.defaultSetup;
  const out = {};
  const model = setup.model ?? {};
  const preset = presetById(model.preset);
  if (preset && model.kind === state.archKind && sameJson(mergeSetup(preset.architecture, model.architecture ?? {}), preset.architecture)) {
    out.model = { preset: preset.id };
  } else {
    // The architecture is kept whole: which defaults fill a partial one depends on its family.
    const m = differences({ ...model, architecture: undefined }, { ...defaults.model, architecture: undefined }) ?? {};
    delete m.architecture;
    if (model.kind === state.archKind && model.architecture) m.architecture = model.architecture;
    if (Object.keys(m).length) out.model = m;
  }
  const training = differences(setup.training ?? {}, defaults.training) ?? {};
  // A preset brings its own sequence length when none is given (the core's
  // defaultSequenceLength), so the length is kept even where it equals the core's default.
  if (out.model?.preset && setup.training?.sequenceLength !== undefined) training.sequenceLength = setup.training.sequenceLength;
  if (Object.keys(training).length) out.training = training;
  const gpu = setup.gpu ?? {};
  const listed = listedGpuOf(gpu);
  const gpuPart = listed ? { id: listed.id } : differences(gpu, defaults.gpu);
  if (gpuPart) out.gpu = gpuPart;
  const runtime = differences(setup.runtime ?? {}, defaults.runtime);
  if (runtime) out.runtime = runtime;
  // Any other section (fine-tuning, and whatever the core adds) by its differences as well.
  for (const [key, value] of Object.entries(setup)) {
    if (['model', 'training', 'gpu', 'runtime', 'schemaVersion'].includes(key)) continue;
    const d = key in defaults ? differences(value, defaults[key]) : value;
    if (d !== undefined) out[key] = d;
  }
  if (setup.schemaVersion !== undefined && setup.schemaVersion !== defaults.schemaVersion) out.schemaVersion = setup.schemaVersion;
  return out;
}

// The page's state in its address: #v=<gpumem version>&s=<short setup> (z=<the same
// compressed> when it is long), units=GB when decimal units are chosen, compare=<setup A> while
// a comparison is pinned, and c=<checksum> last. Called with no setup, it rewrites the last one
// (after a units change). A long setup is compressed asynchronously: the address follows a
// moment later, unless a newer write came first.
export function writeHash(setup) {
  if (setup) state.hashSetup = setup;
  if (!state.hashSetup) return;
  const generation = ++state.hashGeneration;
  const text = JSON.stringify(shortSetup(state.hashSetup));
  const plain = toBase64Url(text);
  if (plain.length <= LONG_SETUP_CHARS || typeof CompressionStream !== 'function') {
    replaceHash('s', plain);
    return;
  }
  deflateSetupText(text).then(
    (compressed) => { if (generation === state.hashGeneration) replaceHash('z', compressed); },
    () => { if (generation === state.hashGeneration) replaceHash('s', plain); },
  );
}

function replaceHash(key, value) {
  const params = new URLSearchParams();
  params.set('v', String(state.options.version ?? ''));
  params.set(key, value);
  if (state.units === 'GB') params.set('units', 'GB');
  if (state.compare) params.set('compare', encodeSetupParam(shortSetup(state.compare.setup)));
  const body = params.toString();
  const hash = `#${body}&c=${linkChecksum(body)}`;
  state.lastHash = hash;
  if (location.hash !== hash) {
    try {
      history.replaceState(null, '', hash);
    } catch {
      location.replace(hash);
    }
  }
  if (state.embed) {
    // The full calculator: the same address without the query (the hash holds the state).
    const url = new URL(location.href);
    url.search = '';
    $('#open-calculator').href = url.href;
  }
}

// What is wrong with the address's hash as a whole: null when it is complete (or is an older
// link without a checksum that reads), else {incomplete, otherVersion} for the banner.
function hashIntegrity(hash) {
  const text = hash.replace(/^#/, '');
  if (!text) return null;
  const params = new URLSearchParams(text);
  const version = params.get('v');
  const otherVersion = version !== null && version !== String(state.options.version ?? '') ? version : null;
  const at = text.lastIndexOf('&c=');
  if (at >= 0) {
    const ok = linkChecksum(text.slice(0, at)) === text.slice(at + 3);
    return ok && !otherVersion ? null : { incomplete: !ok, otherVersion };
  }
  // Written by this page (it has v=) but its checksum is gone: cut off.
  if (version !== null || (!params.has('s') && !params.has('z'))) return { incomplete: true, otherVersion };
  return null;
}

// The banner at the top of the page for a link that cannot be read fully, is from another
// version, or names a preset or GPU this core does not know. Never a silent default.
function showLinkBanner({ incomplete = false, otherVersion = null, problems = [], shown = '' }) {
  const banner = $('#link-banner');
  const lines = [];
  if (incomplete) lines.push('This link is incomplete (it was cut off or changed)');
  if (otherVersion) lines.push(`This link is from another version of gpumem (${otherVersion}; this page is ${state.options.version})`);
  for (const p of problems) {
    // The core's message lists every known id after a ";": the banner names the unknown one.
    if (p.field === 'model.preset') lines.push(`The link names a model preset this version does not know: ${String(p.message).split(';')[0]}`);
    else if (p.field === 'gpu.id') lines.push(`The link names a GPU this version does not know: ${String(p.message).split(' (')[0]}`);
    else lines.push(`The link's ${fieldLabel(p.field)}: ${p.message}`);
  }
  if (!lines.length) {
    banner.hidden = true;
    return;
  }
  const text = document.createElement('p');
  text.id = 'link-banner-text';
  text.textContent = `${lines.map((l) => l.replace(/[.\s]+$/, '')).join('. ')}. ${shown}`;
  const close = document.createElement('button');
  close.type = 'button';
  close.textContent = 'Dismiss';
  close.addEventListener('click', () => { banner.hidden = true; });
  banner.replaceChildren(text, close);
  banner.hidden = false;
}

// ---------- setup sources: defaults, examples, the URL, files ----------

// Fills the form from a (possibly partial) setup. The core's validate() normalises a valid one;
// an invalid one is still shown, so the errors point at what the person gave.
export function applySetup(partial) {
  let problems = [];
  let setup = mergeSetup(presetBaseSetup(partial), partial);
  try {
    const result = state.api.validate(partial);
    if (result.ok) setup = result.setup;
    else problems = result.errors ?? [];
  } catch (exception) {
    problems = errorsOf(exception);
  }
  fillForm(setup, isPlainObject(partial?.model) ? partial.model.preset : undefined);
  update();
  return problems;
}

// What an invalid setup that names a preset is shown over: as the core reads one, the preset's
// architecture with the setup's fields on top, and the transformer kind unless it names another.
function presetBaseSetup(partial) {
  const base = state.options.defaultSetup;
  const model = isPlainObject(partial) && isPlainObject(partial.model) ? partial.model : null;
  if (!model || typeof model.preset !== 'string' || !state.archKind) return base;
  const preset = presetById(model.preset);
  return mergeSetup(base, { model: { kind: state.archKind, ...(preset ? { architecture: preset.architecture } : {}) } });
}

// The state in the address: the hash the page writes (#s=…&gpu=…&units=…&compare=…), or, when
// it holds no setup, the short parameters of a hand-written link or an iframe embed
// (?embed=1&preset=gpt2&batch-size=4&gpu=nvidia-h100-sxm; see web/setup-params.js).
// A compressed setup (z=) is inflated first: then it returns a promise, settled once the setup
// is applied.
export function loadFromHash() {
  const hash = location.hash;
  const compressed = new URLSearchParams(hash.replace(/^#/, '')).get('z');
  if (compressed === null) return loadHash(hash, undefined);
  return inflateSetupText(compressed).then((text) => loadHash(hash, text), (error) => loadHash(hash, error));
}

function loadHash(hash, inflated) {
  state.paramProblems = [];
  const params = new URLSearchParams(hash.replace(/^#/, ''));
  const query = new URLSearchParams(location.search);
  setUnits(params.get('units') ?? query.get('units') ?? 'GiB', { rerender: false });
  loadCompareFrom(params.get('compare') ?? query.get('compare'));
  const integrity = hashIntegrity(hash);
  let fromHash = null;
  try {
    fromHash = setupFromHash(hash, inflated);
  } catch {
    const start = firstVisitSetup();
    applySetup(start);
    showLinkBanner({ incomplete: true, otherVersion: integrity?.otherVersion, shown: `Its setup could not be read; showing ${describeStart(start)} instead, not the link's setup.` });
    ioStatus('The setup in this link could not be read.', true);
    return;
  }
  if (fromHash) {
    const problems = applySetup(fromHash);
    keepUnknownIds(problems, fromHash);
    // A link's problems stay visible in the embed, which has no editor to show them in.
    if (problems.length) showLinkProblems(problems);
    if (integrity || problems.length) {
      showLinkBanner({ ...(integrity ?? {}), problems: problems.filter((p) => p.field === 'model.preset' || p.field === 'gpu.id' || integrity),
        shown: problems.length ? 'Showing what it could read; the form marks what needs fixing.' : 'Showing what it could read: check the setup before trusting the verdict.' });
    }
    ioStatus(problems.length ? `The link's setup has problems: ${problems.map(errorText).join('; ')}` : '');
    return;
  }
  if (integrity) {
    const start = firstVisitSetup();
    applySetup(start);
    showLinkBanner({ ...integrity, incomplete: true, shown: `It holds no setup; showing ${describeStart(start)} instead, not the link's setup.` });
    return;
  }
  const fromQuery = setupFromParams((name) => query.get(name));
  if (fromQuery.given) {
    const problems = [...fromQuery.problems, ...applySetup(fromQuery.setup)];
    keepUnknownIds(problems, fromQuery.setup);
    if (problems.length) showLinkProblems(problems);
    const named = problems.filter((p) => p.field === 'model.preset' || p.field === 'gpu.id' || p.field === 'setup');
    if (named.length) showLinkBanner({ problems: named, shown: 'The form marks what needs fixing.' });
    ioStatus(problems.length ? `The link's setup has problems: ${problems.map(errorText).join('; ')}` : '');
    return;
  }
  applySetup(firstVisitSetup());
}

// An unknown preset or GPU id stays in the form (shown as "(unknown)"), so the core refuses the
// setup and names it, instead of the page estimating whatever architecture or size was left.
function keepUnknownIds(problems, partial) {
  let kept = false;
  if (problems.some((p) => p.field === 'model.preset') && typeof partial?.model?.preset === 'string') {
    for (const radio of $$('input[name=modelKind]')) radio.checked = radio.value === state.archKind;
    showKindPanels();
    setSelectValue($('#preset'), partial.model.preset);
    kept = true;
  }
  if (problems.some((p) => p.field === 'gpu.id') && typeof partial?.gpu?.id === 'string') {
    state.gpuId = partial.gpu.id;
    setSelectValue($('#gpu'), partial.gpu.id);
    kept = true;
  }
  if (!kept) return;
  // The estimate just drawn is of what the form held, not of the link: it must not stay shown.
  state.lastGood = null;
  update();
}

// "Llama 3.2 1B on NVIDIA GeForce RTX 4090 24 GB": the setup shown instead of a broken link's.
function describeStart(setup) {
  const preset = presetById(setup.model?.preset);
  const gpu = gpuById(setup.gpu?.id);
  if (!preset) return 'the default setup';
  return `${preset.label}${gpu ? ` on ${gpu.label}` : ''}`;
}

// Problems with a link's setup (an unknown GPU id, bad JSON) disappear from the form once it
// shows what it could read; the embed, which has no editor, keeps them above its result.
function showLinkProblems(problems) {
  state.paramProblems = problems;
  showParamProblems(problems);
}

export function showParamProblems(problems) {
  const el = $('#embed-error');
  if (!state.embed) return;
  el.hidden = !problems.length;
  el.textContent = problems.map(errorText).join(' ');
}

export function ioStatus(text, isError = false) {
  const el = $('#io-status');
  el.textContent = text;
  el.className = isError ? 'field-error' : 'hint';
}

export function exportSetup() {
  const { setup } = readForm();
  downloadBlob(new Blob([`${JSON.stringify(setup, null, 2)}\n`], { type: 'application/json' }), 'gpumem-setup.json');
  ioStatus('Exported gpumem-setup.json.');
}

export async function importSetup(file) {
  if (!file) return;
  let parsed;
  try {
    parsed = JSON.parse(await file.text());
  } catch (exception) {
    ioStatus(`${file.name} is not JSON: ${exception.message}`, true);
    return;
  }
  if (!isPlainObject(parsed)) {
    ioStatus(`${file.name} does not hold a setup object.`, true);
    return;
  }
  $('#example').value = '';
  const problems = applySetup(parsed);
  if (problems.length) ioStatus(`Imported ${file.name} with problems: ${problems.map(errorText).join('; ')}`, true);
  else ioStatus(`Imported ${file.name}.`);
}

export function loadExample(id) {
  const example = state.examples.find((e) => e.id === id);
  if (!example) return;
  applySetup(example.setup);
  ioStatus(`Loaded the example “${example.label}”.`);
}

// Switching to the layer list with no layers starts from the first layer-list example's model.
export function onKindChange() {
  showKindPanels();
  if (currentKind() === state.layersKind && $$('#layer-list > li').length === 0 && $('#layer-json').hidden) {
    const example = state.examples.find((e) => e.setup?.model?.kind === state.layersKind);
    if (example) {
      renderLayers(example.setup.model.layers ?? []);
      if (example.setup.model.loss) setSelectValue($('#loss'), example.setup.model.loss);
    }
  }
}
