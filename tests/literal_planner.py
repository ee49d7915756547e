"""TEST ORACLE: a literal, slow, line-by-line transcription of docs/planner.md.

This is NOT the planner. ``dyntra_lb.planner.front.balance_load`` is the planner; this module
exists only so tests and ``benchmarks/planner_bench.py`` can check that planner's output
against the algorithm exactly as vllm-ascend runs it: items are dicts compared by value,
``list.remove`` removes the first equal dict, cards are re-sorted with Python's stable
sort, every swap search scans all running x waiting pairs. Keep it dumb: any cleverness
here would make it a second implementation instead of an oracle.
"""

THROUGHPUT_FIXED = 20000
THROUGHPUT_PER_BLOCK = 19.2


def literal_balance_load(requests_by_rank, dev_num, max_num_seqs=None, max_iters=1000,
                         threshold=5, protect_fill=False):
    """docs/planner.md, transcribed. Returns a list of ``dev_num`` dicts
    ``{"out_blk": [...], "in_blk": [...], "freeze": bool}``. ``protect_fill`` True is
    the oracle of the opt-in ``fill-protect`` planner: the drop skips newly added items
    (its one change, marked below)."""
    # Call and output
    modifications = []
    for _ in range(dev_num):
        modifications.append({"out_blk": [], "in_blk": [], "freeze": False})

    # Input and parsing
    cards = []
    for r in range(dev_num):
        if r < len(requests_by_rank):
            blks, split = requests_by_rank[r]
        else:
            blks, split = [], 0
        running = []
        waiting = []
        for i, blk in enumerate(blks):
            if blk == 0:
                break
            item = {"blk_num": int(blk), "newly_added": False}
            if i < split:
                running.append(item)
            else:
                waiting.append(item)
        tot_blk = 0
        for item in running:
            tot_blk += item["blk_num"]
        cards.append({"card_idx": r, "running": running, "waiting": waiting,
                      "tot_blk": tot_blk})

    # Bubble metric
    def get_bubble():
        tots = [card["tot_blk"] for card in cards]
        max_blk = max(tots)
        avg = sum(tots) / dev_num
        if threshold < 1:
            if max_blk <= 0:
                return 0.0
            return (max_blk - avg) / max_blk
        return max_blk - avg

    # Fill step
    if max_num_seqs is not None:
        for card in cards:
            while len(card["running"]) < max_num_seqs and len(card["waiting"]) > 0:
                item = card["waiting"].pop(0)
                item["newly_added"] = True
                modifications[card["card_idx"]]["in_blk"].append(item["blk_num"])
                card["tot_blk"] += item["blk_num"]
                card["running"].append(item)

    # Swap search
    def find_best_swap(card, mode):
        total = 0
        for c in cards:
            total += c["tot_blk"]
        target = total / dev_num
        best_dist = abs(card["tot_blk"] - target)
        best = None
        best_new = False
        for r_item in card["running"]:
            for w_item in card["waiting"]:
                delta = w_item["blk_num"] - r_item["blk_num"]
                if mode == "increase" and delta <= 0:
                    continue
                if mode == "decrease" and delta >= 0:
                    continue
                new_dist = abs((card["tot_blk"] + delta) - (target + delta / dev_num))
                if new_dist < best_dist or (
                    new_dist == best_dist and r_item["newly_added"] and not best_new
                ):
                    best_dist = new_dist
                    best = (r_item, w_item)
                    best_new = r_item["newly_added"]
        return best

    def perform_swap(r_item, w_item, card):
        mod = modifications[card["card_idx"]]
        mod["out_blk"].append(r_item["blk_num"])
        mod["in_blk"].append(w_item["blk_num"])
        card["tot_blk"] += w_item["blk_num"] - r_item["blk_num"]
        card["running"].remove(r_item)
        card["waiting"].remove(w_item)
        card["running"].append(w_item)
        card["waiting"].append(r_item)

    # Throughput-drop heuristic
    def try_drop_for_throughput(max_card):
        n = 0
        for c in cards:
            n += len(c["running"])
        if n <= 1:
            return False
        m = max_card["tot_blk"]
        s = 0
        for c in cards:
            if c is not max_card:
                s = max(s, c["tot_blk"])
        best_tp = n / (THROUGHPUT_FIXED + THROUGHPUT_PER_BLOCK * m)
        best_item = None
        best_new = False
        for r_item in max_card["running"]:
            if protect_fill and r_item["newly_added"]:  # fill-protect only
                continue
            m_new = max(m - r_item["blk_num"], s)
            tp = (n - 1) / (THROUGHPUT_FIXED + THROUGHPUT_PER_BLOCK * m_new)
            if tp > best_tp or (tp == best_tp and r_item["newly_added"] and not best_new):
                best_tp = tp
                best_item = r_item
                best_new = r_item["newly_added"]
        if best_item is None:
            return False
        modifications[max_card["card_idx"]]["out_blk"].append(best_item["blk_num"])
        max_card["tot_blk"] -= best_item["blk_num"]
        max_card["running"].remove(best_item)
        max_card["waiting"].append(best_item)
        return True

    # Main loop
    iteration = 0
    while iteration < max_iters:
        cards.sort(key=lambda c: c["tot_blk"], reverse=True)
        if get_bubble() < threshold:
            break
        swapped = False
        dropped = False
        min_card = cards[-1]
        best = find_best_swap(min_card, "increase")
        if best is not None:
            perform_swap(best[0], best[1], min_card)
            swapped = True
            if get_bubble() < threshold:
                break
            cards.sort(key=lambda c: c["tot_blk"], reverse=True)
        max_card = cards[0]
        best = find_best_swap(max_card, "decrease")
        if best is not None:
            perform_swap(best[0], best[1], max_card)
            swapped = True
        if not swapped:
            dropped = try_drop_for_throughput(max_card)
        if get_bubble() < threshold:
            break
        if not swapped and not dropped:
            break
        iteration += 1

    # Cancellation, Freeze
    for mod in modifications:
        out_blk = mod["out_blk"]
        cancelled = [False] * len(out_blk)
        kept_in = []
        for value in mod["in_blk"]:
            found = False
            for j in range(len(out_blk)):
                if not cancelled[j] and out_blk[j] == value:
                    cancelled[j] = True
                    found = True
                    break
            if not found:
                kept_in.append(value)
        kept_out = []
        for j in range(len(out_blk)):
            if not cancelled[j]:
                kept_out.append(out_blk[j])
        mod["out_blk"] = kept_out
        mod["in_blk"] = kept_in
        mod["freeze"] = len(kept_in) == 0
    return modifications
