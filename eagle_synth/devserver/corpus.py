"""The English text the devserver's emulated model "speaks".

Output tokens are slices of this text's token ids, so stored records compress and decode like
real model output (ordinary words, punctuation, lists, a little code) rather than random ids.
Written for this project; mixed registers on purpose so slices vary in texture.
"""

CORPUS_TEXT = """\
Let me think about this carefully before answering. The question asks how a small river town \
should plan for a wet spring, and there are really three parts to it: what the water will do, \
what people can change in the time they have, and what they should leave alone.

First, the water. Snow on the hills melts slowly in March and quickly in April, so the river \
usually rises twice. The second rise is the one that matters, because the ground is already \
full and every extra centimetre of rain runs straight into the channel. A gauge reading of 3.2 \
metres at the old stone bridge has meant wet cellars in the past; 4.0 metres has meant closed \
roads. Those two numbers are worth writing on a card and pinning next to the phone.

Second, the changes that can be made in a few weeks:

1. Clear the culverts under the main road, since a single blocked pipe can flood a street \
that the river itself never reaches.
2. Move the sandbag store from the low warehouse to the school gym, which sits two metres higher.
3. Agree who calls whom. A phone tree with ten names is slow but it works when the internet does not.
4. Check that the pumps start. An engine that has not run since last autumn often will not.

Third, the things to leave alone. It is tempting to raise a wall along the whole bank, but a \
wall built in a hurry tends to push the water onto the neighbours downstream, and it hides the \
river from the people who need to watch it. Meadows that flood every year are doing useful work; \
they hold water that would otherwise arrive in town all at once.

Wait, I should double-check the timing. If the melt comes early, the first and second rises can \
merge into one long high-water period, and then the pumps matter more than the sandbags. So the \
plan should say what to do in both cases rather than guess which one will happen.

Here is a short way to keep track of the readings:

```python
def level_status(reading_m: float) -> str:
    if reading_m >= 4.0:
        return "close the low roads"
    if reading_m >= 3.2:
        return "warn the cellar streets"
    return "normal"
```

A spreadsheet would do the same job. What matters is that someone looks at the gauge every \
morning and every evening, writes the number down, and compares it with yesterday.

To summarize: watch the second rise, fix the cheap things first, keep the meadows as they are, \
and make sure the people who will be awake at three in the morning know exactly what the \
numbers mean. None of this is expensive. Most of it is simply remembering, in February, what \
everyone knew very well the previous May.

On a different note, the library committee asked for a short history of the town for the \
spring fair. The first houses went up near the ford in the eighteenth century, when a miller \
dammed the side channel and built a wheel that ground grain for the farms on both banks. The \
mill burned twice and was rebuilt twice; the third building still stands, although it has been \
a bakery, a garage and, for one strange summer, a museum of clocks.

The railway arrived in 1871 and changed everything. Farmers could send milk to the city before \
it turned, and the town grew a market square, a hotel with twelve rooms and a brass band that \
played, by most accounts, loudly rather than well. When the line closed in 1964 the station \
became a youth club, and the platform is now a long garden where children grow beans.

Is there a lesson in all this? Perhaps only that places survive by changing their uses without \
losing their shape. The mill, the station and the meadows are all still where they were; what \
people do with them has changed many times, and will change again.

Now let me answer the second question, about budgets. The simplest honest approach is to list \
every cost, mark which ones happen every year and which happen once, and then ask which of the \
one-off costs prevent a yearly one. Cleaning culverts costs a day of work each autumn; a flooded \
street costs weeks of repairs. Numbers like these make the decision easier than any argument.

Finally, a note on tone. When you write to residents, be plain and specific: say which streets, \
which days and which telephone number. People forgive a warning that turns out to be unneeded; \
they do not forgive one that was vague. Thank you for the thoughtful question, and good luck \
with the preparations.
"""
