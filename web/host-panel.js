// Host (CPU) memory, from estimate.host (core/src/replay/host_memory.cpp; docs/device.md "Host
// memory"): what offloading keeps in host RAM per rank and per node, pinned or pageable, and the
// paged optimizer states that may move there. Shown only when the core reports any; every
// number is the core's.
import { bytesTitle, formatBytes, formatExactBytes } from './charts.js';
import { $ } from './page-state.js';

const HOST_MEMORY_WORDS = {
  pinned: 'pinned',
  pageable: 'pageable',
  unified: 'pageable: may move to host',
};

function hostCell(text, className) {
  const td = document.createElement('td');
  if (className) td.className = className;
  td.textContent = text;
  return td;
}

export function renderHost(est) {
  const block = $('#host');
  if (!block) return;
  const host = est.host;
  if (!host || !Array.isArray(host.rows) || host.rows.length === 0) {
    block.hidden = true;
    return;
  }
  block.hidden = false;
  $('#host-table tbody').replaceChildren(...host.rows.map((row) => {
    const tr = document.createElement('tr');
    tr.dataset.memory = row.memory;
    tr.title = `${row.formula} — ${row.source}`;
    const bytes = hostCell(formatExactBytes(row.bytes), 'num');
    bytes.dataset.bytes = String(row.bytes);
    const size = hostCell(formatBytes(row.bytes), 'num');
    size.title = bytesTitle(row.bytes);
    tr.append(hostCell(row.label), size, bytes, hostCell(HOST_MEMORY_WORDS[row.memory] ?? row.memory), hostCell(row.source, 'formula'));
    return tr;
  }));
  const total = (label, bytes, id, memo) => {
    const tr = document.createElement('tr');
    const exact = hostCell(formatExactBytes(bytes), 'num');
    exact.id = id;
    exact.dataset.bytes = String(bytes);
    tr.append(hostCell(label), hostCell(formatBytes(bytes), 'num'), exact, hostCell(memo), hostCell(''));
    return tr;
  };
  $('#host-table tfoot').replaceChildren(
    total('Host RAM per rank', host.rankBytes, 'host-rank-total', `${formatBytes(host.pinnedBytes)} pinned`),
    total(`Host RAM per node (${host.ranksPerNode} ${host.ranksPerNode === 1 ? 'rank' : 'ranks'})`, host.nodeBytes, 'host-node-total', ''));
  // runtime.hostMemoryGiB stated: the core's verdict on the node's host RAM.
  const verdict = $('#host-verdict');
  verdict.hidden = !(host.capacityBytes > 0);
  if (host.capacityBytes > 0) {
    verdict.dataset.fits = String(host.fits);
    verdict.textContent = host.fits
      ? `Fits in the ${formatBytes(host.capacityBytes)} of host memory stated per node (${formatBytes(host.capacityBytes - host.nodeBytes)} left).`
      : `Does not fit in the ${formatBytes(host.capacityBytes)} of host memory stated per node: a node needs ${formatBytes(host.nodeBytes)}, so the processes would run out of CPU memory.`;
  }
  const paged = $('#host-unified');
  paged.hidden = !(host.unifiedBytes > 0);
  if (host.unifiedBytes > 0) {
    paged.textContent = `${formatBytes(host.unifiedBytes)} of paged optimizer states live in CUDA unified memory, outside PyTorch's allocator: on the GPU while there is room beside it (the device figure counts what stays), moved to host RAM by the driver when the GPU runs short.`;
  }
}
