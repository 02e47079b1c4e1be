"""The fixed English text every configuration is fed, token by token (teacher forcing).

Greedy decoding of a random-weight model repeats one token, its routing never changes and
any expert cache looks perfect; forcing a real text keeps the routing moving. Written for
this bench (plain English, no licence concerns).
"""

TEXT = """\
The harbour town woke slowly on winter mornings. Before the sun cleared the hills, the
bakers had already lit their ovens, and the smell of bread drifted down the narrow streets
toward the water. Fishermen checked their nets by lamplight, counting the torn places and
arguing about the weather, which they could never predict and never stopped trying to.

Most visitors came in summer, when the ferries ran every hour and the cafes put their
tables out on the quay. In winter the town belonged to the people who lived there: the
teacher who walked her dog along the sea wall at seven, the old man who repaired clocks in
a shop no wider than a doorway, the twins who ran the hardware store and still wrote every
sale in a paper ledger because, they said, paper never forgets and never needs a charger.

The lighthouse at the end of the northern pier had been automated for thirty years, but
the keeper's cottage was still lived in. A retired engineer rented it from the council and
spent his days measuring things: the height of the tide, the speed of the wind, the number
of ships that passed the headland. He kept his numbers in notebooks and, once a month,
typed them into a computer at the library so that a university two hundred miles away
could study how the coast was changing. Nobody in the town had ever asked him what the
numbers showed. When a child finally did, he thought about it for a long time and said
that the sea was patient, that it was winning, and that it would take a very long while.

In the spring the council held a meeting about the sea wall. Engineers had drawn three
plans. The first raised the wall by a metre and cost a great deal of money. The second
moved the road back from the water and cost even more, because houses would have to be
bought. The third did almost nothing and cost almost nothing, and the engineers had
written it down mostly so that people could see what doing nothing would mean. The meeting
went on until midnight. People spoke about their parents and grandparents, about storms
they remembered and storms they had only heard about, about taxes and tourists and the
price of fish. In the end they voted for the first plan, and then, because it was late and
everyone was tired, they went home without deciding how to pay for it.

Work began in the autumn. Lorries brought stone from a quarry in the hills, and a crane
stood on the quay for four months like a patient heron. The children watched from the
school windows. The engineer in the lighthouse cottage added a new column to his
notebooks, for the height of the wall, and drew a careful line across the page each week.
When the first winter storm came, the waves climbed the new stones and fell back, and the
street behind the wall stayed dry. The bakers lit their ovens as usual the next morning,
and the smell of bread drifted down toward the water, which was, for now, where it
belonged.
"""
